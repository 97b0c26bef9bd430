"""A worker whose checkpoints do not save the training RNG state (a fresh one is written instead).

The control of the drill's state check: it shows that check can fail, and that it names the
field that diverged. A test-only switch, kept out of the product: the drill test runs this
module as its worker (``DrillSpec.worker_module``) instead of ``workers.worker``.
"""

from __future__ import annotations

import sys
from typing import Any

import cairn.session
from cairn.trainers.mlp.arithmetic import fresh_rng_state
from workers.worker import exit_now, main

_save_training = cairn.session.save_training


def _save_without_rng(store: Any, run_id: str, state: Any, **kw: Any) -> Any:
    broken = state.copy()
    broken.rng_state = fresh_rng_state(state.config)  # "not saved": restores as a new RNG
    return _save_training(store, run_id, broken, **kw)


cairn.session.save_training = _save_without_rng  # type: ignore[assignment]

if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
