"""Epochs without replacement (``cairn.sampler``): a new permutation per epoch, the same batches
mid-epoch from a fresh sampler, and an exact cursor."""

from __future__ import annotations

import numpy as np

from cairn.sampler import EpochSampler


def test_epoch_sampler_draws_without_replacement_and_resumes_mid_epoch() -> None:
    sampler = EpochSampler(n_examples=50, batch_size=8, seed=3)
    assert sampler.steps_per_epoch == 6
    epoch0 = np.concatenate([sampler.batch(t) for t in range(6)])
    assert len(set(epoch0.tolist())) == 48  # no example twice in an epoch (2 dropped)
    epoch1 = np.concatenate([sampler.batch(t) for t in range(6, 12)])
    assert not np.array_equal(epoch0, epoch1)  # a new permutation per epoch
    later = EpochSampler(n_examples=50, batch_size=8, seed=3)  # a fresh process, mid-epoch
    assert all(np.array_equal(later.batch(t), sampler.batch(t)) for t in (9, 10, 11, 3))
    assert sampler.cursor(9).to_json() == {"epoch": 1, "position": 3}
