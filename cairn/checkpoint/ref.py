"""Checkpoint references: the one string every command and workflow passes around.

A reference is the checkpoint's location: ``STORE/RUN_ID/KIND/STEP`` where STORE is a
directory or an ``s3://bucket/prefix`` URL and STEP has twelve digits, e.g.
``runs/demo/training/000000000040`` or ``s3://ckpts/team/demo/training/000000000040``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cairn.checkpoint.layout import MANIFEST_NAME, RUN_ID_PATTERN, STEP_DIGITS, checkpoint_prefix
from cairn.checkpoint.manifest import CheckpointKind
from cairn.errors import ReferenceSyntaxError

__all__ = ["CheckpointRef"]


@dataclass(frozen=True)
class CheckpointRef:
    store_url: str
    run_id: str
    kind: CheckpointKind
    step: int

    @property
    def prefix(self) -> str:
        return checkpoint_prefix(self.run_id, self.kind, self.step)

    def __str__(self) -> str:
        return f"{self.store_url.rstrip('/')}/{self.prefix}"

    @classmethod
    def parse(cls, text: str) -> CheckpointRef:
        """Parse ``STORE/RUN_ID/KIND/STEP`` (a trailing ``/manifest.json`` is accepted)."""
        raw = text.strip()
        if "\0" in raw or "\n" in raw:
            raise ReferenceSyntaxError("NUL or newline in a checkpoint reference", field="checkpoint", found=raw)
        body = raw.rstrip("/")
        if body.endswith("/" + MANIFEST_NAME):
            body = body[: -len(MANIFEST_NAME) - 1]
        parts = body.rsplit("/", 3)
        expected = "STORE/RUN_ID/KIND/STEP, e.g. runs/demo/training/000000000040"
        if len(parts) != 4 or not parts[0]:
            raise ReferenceSyntaxError(field="checkpoint", expected=expected, found=raw)
        store_url, run_id, kind, step = parts
        if not RUN_ID_PATTERN.match(run_id):
            raise ReferenceSyntaxError("not a valid run id", field="checkpoint.run_id", expected=expected, found=run_id)
        try:
            kind_enum = CheckpointKind(kind)
        except ValueError:
            raise ReferenceSyntaxError(
                field="checkpoint.kind", expected=[k.value for k in CheckpointKind], found=kind
            ) from None
        if len(step) != STEP_DIGITS or not step.isascii() or not step.isdigit():
            raise ReferenceSyntaxError(field="checkpoint.step", expected=f"{STEP_DIGITS} digits", found=step)
        if store_url.endswith(":/") or store_url.endswith(":"):
            raise ReferenceSyntaxError(field="checkpoint", expected=expected, found=raw)
        return cls(store_url=store_url, run_id=run_id, kind=kind_enum, step=int(step))
