"""Collectives whose bits do not depend on the world size, below the trainers: ``comm`` (the
collective engine: ``torch.distributed``, or one process), ``reduce`` (the canonical tree
reduction), ``partition`` (who owns which checkpoint blocks and optimizer slices; valid world
sizes), ``checkpoint`` (coordinated save and load). The engines that use them live with their
trainers (``cairn.trainers.mlp.zero``, ``cairn.trainers.pytorch.data_parallel``); the rank
processes in ``cairn.gang``."""
