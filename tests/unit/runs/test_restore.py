"""Where a segment's state comes from (``cairn.runs.restore``): memory only when it is exactly
the latest commit on a first attempt without a rollback; else a rollback's checkpoint, the
durable latest, or step 0; and never past the segment's target. (The activity's use of it:
``tests/unit/activities/test_warm.py``.)"""

from __future__ import annotations

import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointRef
from cairn.checkpoint.options import CheckpointOptions
from cairn.runs.restore import choose_restore, require_not_past
from cairn.runs.warm import WarmRun
from cairn.stores import MemoryStore
from tests.conftest import small_config


def test_each_source_in_turn() -> None:
    store, config, options = MemoryStore("restore"), small_config(), CheckpointOptions.from_env()
    session, source = choose_restore("run", config, store, options)
    assert (source, session.state.step) == ("fresh", 0)
    session.run(10, checkpoint_every=5)
    held = WarmRun("run", "key", session, 0.0)
    warm, source = choose_restore("run", config, store, options, held=held)
    assert source == "memory" and warm is session
    retry, source = choose_restore("run", config, store, options, held=held, first_attempt=False)
    assert (source, retry.state.step) == ("durable", 10) and retry is not session
    rollback = str(CheckpointRef(store.url, "run", CheckpointKind.TRAINING, 5))
    back, source = choose_restore("run", config, store, options, held=held, resume_from=rollback)
    assert (source, back.state.step) == ("durable", 5)


def test_a_segment_never_resumes_past_its_target() -> None:
    require_not_past(10, 10)
    with pytest.raises(E.InvariantError, match="latest committed step 11 is past this segment's target 10"):
        require_not_past(11, 10)
