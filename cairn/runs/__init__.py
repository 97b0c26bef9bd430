"""A run's records in its store and its sessions between segments, the top of the library beside
the gang.

Modules: ``ownership`` (absolute store URLs, the store the run started on, which workflow trains
the run), ``preflight`` (what a run needs of its store before its first step), ``record`` (the
loss/lr history and the committed checkpoints, as reports read them), ``restore`` (where a
segment's state comes from: memory, a rollback, the local tier, the durable store or step 0),
``tier_restore`` (where a segment resumes from when its worker has a node-local tier), ``warm``
(the training sessions a worker keeps in memory between a run's segments), ``outcome`` (how a
segment ended, as the activity and a gang's ranks report it).
"""
