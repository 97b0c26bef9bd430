"""Cairn's benchmarks, run from the repository root as modules (``bench`` is not installed).

- ``registry``: the benchmarks — name, section of ``BENCHMARKS.md``, plot; the runner and the
  report both read it;
- ``suites/``: one module per benchmark; it measures and writes ``bench/results/NAME.json``
  (``python -m bench.suites.NAME [--quick]``);
- ``sections/``: one module per benchmark; it renders its section of ``BENCHMARKS.md`` and its
  plot from that JSON;
- ``harness/``: what the suites share (states, timing, servers, worker processes, the floor);
- ``run_all`` (``make bench``: every suite in a process of its own, then the report) and
  ``report`` (``BENCHMARKS.md``, the plots and the README's headline from the results).
"""
