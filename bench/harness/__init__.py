"""What the benchmark suites share; none of it is a benchmark.

``process`` (numerics pins and the mmap threshold, before numpy loads), ``results`` (where
results go), ``measure`` (interleaved timing, peak RSS, cache eviction), ``states`` (states of
a given size), ``machine`` (what the numbers were measured on), ``floor`` (plain I/O of the
same bytes), ``servers`` (SeaweedFS, a Temporal dev server), ``temporal`` (reading a run off
the server), ``worker`` (the one way to start a ``cairn worker``), ``fleet`` (workers that a
recovery benchmark kills), ``steps`` (the step probe in ``step_probe/`` and the workers' JSON
logs), ``adapter`` (the PyTorch adapter on the bench's state), ``previous_reader`` (the read
path before restores overlapped reading with checking), ``ranks`` (what every rank of a
distributed gang runs).
"""
