"""Collectives whose bits do not depend on the world size, and the coordinated checkpoints of a
gang, below the trainers. The data-parallel engines live with their trainers
(``cairn.trainers.mlp.zero``, ``cairn.trainers.pytorch.data_parallel``) and supply only their
layout to ``engine``; the rank processes are in ``cairn.gang``.

Modules: ``comm`` (the collective engine: torch.distributed, or one process), ``reduce`` (the
canonical tree reduction), ``partition`` (who owns which checkpoint blocks and optimizer slices;
valid world sizes), ``checkpoint`` (coordinated save and load of blocks), ``history`` (a gang's
history segments), ``engine`` (a training state's coordinated load and save: the manifest's
checks, agreement, value rules, history, lineage; an engine's layout through ``RankShare``)."""

from cairn.distributed.partition import check_world_size

__all__ = ["check_world_size"]
