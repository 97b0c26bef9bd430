"""A gang: the rank processes of one data-parallel segment, started and supervised the way the
field does it (torchrun).

Modules: ``launch`` (the supervisor side), ``agent`` (torchrun, dying with its parent), ``rank``
(one rank process), ``job`` (the typed job and result between them)."""

from cairn.gang.job import GangJob, RankResult
from cairn.gang.launch import Gang, GangSpec, free_endpoint, free_port

__all__ = ["Gang", "GangJob", "GangSpec", "RankResult", "free_endpoint", "free_port"]
