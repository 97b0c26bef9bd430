"""A run's records in its store, beside its checkpoints: ``ownership`` (the store's identity and
which workflow trains the run), ``stages`` (step 0: fresh, or a new stage on another run's
weights), ``exposures`` (final-test exposures, a numbered log), ``record`` (the loss/lr history
and the committed checkpoints, as reports read them)."""
