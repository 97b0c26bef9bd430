"""The built-in trainer: a pure, seeded, float64 numpy MLP.

Modules: ``arithmetic`` (the model and optimizer: S_{t+1} = F(S_t, D_t)), ``trainer`` (it,
behind the trainer interface: cairn.trainers.mlp:MLPTrainer, the default trainer), ``zero`` (its
data-parallel engine: ZeRO-1 sharded optimizer, bit-identical for every world size)."""

from cairn.trainers.mlp.trainer import MLPTrainer

__all__ = ["MLPTrainer"]
