"""A gang: the rank processes of one data-parallel segment, started and supervised the way the
field does it (torchrun).

Modules: ``launch`` (the supervisor side), ``agent`` (torchrun, dying with its parent), ``rank``
(one rank process), ``job`` (the typed job and result between them)."""
