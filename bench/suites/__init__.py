"""The benchmarks: one module per ``bench.registry`` entry, each run in a process of its own as
``python -m bench.suites.NAME [--quick]`` from the repository root. A suite measures and writes
``results/NAME.json`` (``bench.harness.results``; a quick run into the temp dir); its section of
``BENCHMARKS.md`` is rendered by ``bench.sections.NAME``.

Importing this package prepares the process before any suite imports numpy
(``bench.harness.process``).
"""

from bench.harness.process import prepare_process

prepare_process()
