"""Chaos-kill recovery drills (``cairn drill``): ``schedule`` (the spec and its seeded fault
plan), ``runner`` (the drill's main loop), ``faults`` (firing faults, measuring recovery),
``pool`` (the worker processes), ``watch`` and ``observe`` (what the drill sees), ``stack`` (the
servers it may kill), ``faultproxy`` (storage faults on purpose), ``verdict`` (what must hold)."""
