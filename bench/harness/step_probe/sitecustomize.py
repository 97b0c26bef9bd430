"""A bench-only probe: the wall-clock time of every training step a worker process computes.

Put this folder on ``PYTHONPATH`` and set ``CAIRN_BENCH_STEP_LOG`` to a folder; every Python
process started so then appends one line per step to ``FOLDER/steps-PID.log``:
``TIME STEP ATTEMPT RUN_ID`` (``time.time()``, microseconds). Nothing in Cairn changes: when
``activities.metrics`` is imported, its ``cairn_training_steps`` counter (which
``train_segment`` increments once per update, right after the update and its checkpoint, if
any) gets an ``inc`` that also writes the line (a few microseconds: one ``os.write``).
Without ``CAIRN_BENCH_STEP_LOG`` this module does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

_FOLDER = os.environ.get("CAIRN_BENCH_STEP_LOG")
_TARGET = "activities.metrics"


def _patch(module: object) -> None:
    counter = module.STEPS  # type: ignore[attr-defined]
    original = counter.inc
    fd = os.open(os.path.join(_FOLDER or ".", f"steps-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def inc(amount: float = 1) -> None:
        now = time.time()
        step, run, attempt = -1, "-", 0
        try:
            from temporalio import activity

            from activities.log_context import _CONTEXT

            context = _CONTEXT.get()
            if context is not None:
                step = context.get("step") if context.get("step") is not None else -1
                run = context.get("run_id") or "-"
            if activity.in_activity():
                attempt = activity.info().attempt
        except Exception:  # noqa: BLE001, S110 - a probe never breaks the step it times
            pass
        os.write(fd, f"{now:.6f} {step} {attempt} {run}\n".encode())
        original(amount)

    counter.inc = inc


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                run = loader.exec_module

                def exec_module(module, run=run):  # type: ignore[no-untyped-def]
                    run(module)
                    try:
                        _patch(module)
                    except Exception as exc:  # noqa: BLE001 - no counter to wrap: the worker runs as is, unprobed
                        sys.stderr.write(f"step probe not installed: {exc!r}\n")

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


if _FOLDER:
    sys.meta_path.insert(0, _Finder())
