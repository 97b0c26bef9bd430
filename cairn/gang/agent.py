"""torchrun, guarded: ``python -m cairn.gang.agent TORCHRUN-ARGS...``.

The agent dies with the process that started it (``PR_SET_PDEATHSIG``, set here in the agent
itself rather than by a ``preexec_fn`` in a threaded parent), and exits at once if that parent
is already gone; then it runs ``torch.distributed.run`` in this process. Its ranks die with it
in turn (``cairn.gang.rank``), so a SIGKILLed worker leaves no agent and no rank.
"""

from __future__ import annotations

import os
import runpy
import sys

from cairn.gang.rank import die_with_parent

PARENT_ENV = "CAIRN_GANG_PARENT"


def main() -> None:
    die_with_parent()
    expected = os.environ.get(PARENT_ENV)
    if expected is not None and str(os.getppid()) != expected:
        sys.exit(1)  # the supervisor died before the death signal was armed
    sys.argv = ["torch.distributed.run", *sys.argv[1:]]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
