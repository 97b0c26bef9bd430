"""The ``cairn`` command line: ``main`` holds the command table; one module per command group."""
