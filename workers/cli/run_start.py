"""``cairn run start``: validate the run file here, refuse what would fail at once, and send
the run what the user wrote.

- **Validated before anything starts** (``workers.run_input.load_run_input``): a bad file
  exits 2 even with Temporal down.
- **Refused before the workflow starts** when the run id belongs to another workflow that is
  still running (its owner record in the store, ``cairn.runs.ownership``, and Temporal's word
  that the owner runs): one ``RunOwnershipError`` line naming the owner, and no workflow. A
  closed or unknown owner is no refusal: the new workflow takes the run over. The run's own
  check (``open_run``) stays, for runs started with the ``temporal`` CLI or the Web UI, and
  for a store this machine cannot read (then nothing is refused here).
- **The input sent is the user's** (``workers.run_input.sent_input``): the fields the file and
  flags set, with the store path resolved; the workflow fills in and validates the defaults
  itself, so its Input panel shows what the user wrote, not every default of every section.
"""

from __future__ import annotations

import argparse
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.inputs import WORKFLOW_TYPE, TrainingRunInput
from activities.views import RunSummary
from cairn.errors import RunOwnershipError, TemporalRefusedError
from cairn.runs import OwnerRecord, read_owner
from cairn.stores import open_store
from workers.cli.output import emit
from workers.cli.run_status import off_loop
from workers.cli.temporal import show_result
from workers.client import WORKFLOW_TASK_TIMEOUT
from workers.run_input import load_run_input, sent_input

__all__ = ["load_start_input", "refuse_owned_run", "start"]


def load_start_input(args: argparse.Namespace) -> None:
    overrides: dict[str, Any] = {}
    if args.world_size is not None:
        overrides["world_size"] = args.world_size
    if args.nodes is not None:
        # "" clears the file's nodes (one node, any worker); an empty name in a list is refused, not dropped.
        overrides["nodes"] = args.nodes.split(",") if args.nodes.strip() else []
    if args.total_steps is not None:
        overrides.update(total_steps=args.total_steps, total_epochs=None)
    if args.run_numerics is not None:
        overrides["numerics"] = args.run_numerics
    # bad input: exit 2 even with Temporal down
    args.run_input = load_run_input(args.run_file, overrides=overrides, sets=args.set)


async def _owner(inp: TrainingRunInput) -> OwnerRecord | None:
    try:
        return await off_loop(lambda: read_owner(open_store(inp.store), inp.run_id))
    except Exception:  # noqa: BLE001 - the store cannot be read from here: the run's own check decides
        return None


async def refuse_owned_run(client: Client, inp: TrainingRunInput, workflow_id: str) -> None:
    """Raise ``RunOwnershipError`` when ``inp.run_id`` is owned by another, running, workflow."""
    owner = await _owner(inp)
    if owner is None or owner.workflow_id == workflow_id:
        return  # nobody owns it, or this workflow id does (a running one is refused by Temporal itself)
    try:
        desc = await client.get_workflow_handle(owner.workflow_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return  # an owner Temporal does not know (deleted, another namespace): taken over
        raise
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return  # a closed owner: the run continues from its latest checkpoint under this workflow
    raise RunOwnershipError(
        f"run {inp.run_id!r} is being trained by workflow {owner.workflow_id!r} (running; owner since "
        f"{owner.claimed_at}); nothing was started: use another run_id, or stop that workflow first "
        f"(cairn run stop {owner.workflow_id})",
        field="run_id",
    )


async def start(args: argparse.Namespace, client: Client) -> int:
    inp: TrainingRunInput = args.run_input
    workflow_id = args.workflow_id or inp.run_id
    await refuse_owned_run(client, inp, workflow_id)
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE,
            sent_input(inp),
            id=workflow_id,
            task_queue=args.task_queue,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
            result_type=RunSummary,
        )
    except WorkflowAlreadyStartedError:
        raise TemporalRefusedError(
            f"a workflow with id {workflow_id!r} is already running: watch it with `cairn run watch {workflow_id}`, "
            "or start this run under another --workflow-id",
            field="workflow_id",
        ) from None
    if not args.wait:
        emit(
            args,
            {
                "workflow_id": workflow_id,
                "run_id": handle.result_run_id,
                "task_queue": args.task_queue,
                "store": inp.store,
            },
            f"started {WORKFLOW_TYPE} {workflow_id} on task queue {args.task_queue!r} (store {inp.store}, numerics "
            f"{inp.numerics})\n"
            f"  watch:  cairn run watch {workflow_id}\n  result: cairn run result {workflow_id}",
        )
        return 0
    return await show_result(args, client, workflow_id)
