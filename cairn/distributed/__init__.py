"""Data-parallel training whose bits do not depend on the world size.

``reduce`` (the canonical tree reduction), ``partition`` (who owns which checkpoint blocks and
optimizer slices), ``comm`` (the collective engine: ``torch.distributed``, or one process),
``zero`` (the built-in MLP, ZeRO-1 sharded), ``checkpoint`` (coordinated save and load),
``rank`` (a rank process, as ``torchrun`` starts it) and ``launch`` (starting and supervising a
gang of rank processes), ``torch_dp`` (the PyTorch adapter, replicated optimizer). ``comm`` and
``rank`` import torch only when a collective is needed; ``torch_dp`` needs the ``torch`` extra.
"""
