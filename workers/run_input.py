"""A run file (``cairn run start --input FILE``, drills): read, resolved and validated once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from activities.inputs import TrainingRunInput
from cairn.config import config_error_from
from cairn.config_files import apply_overrides, load_document
from cairn.errors import ConfigError
from cairn.runs import resolve_store_url
from cairn.trainers import check_trainer_options

__all__ = ["load_run_input", "sent_input"]


def load_run_input(
    path: str, cwd: str | Path | None = None, overrides: dict[str, Any] | None = None, sets: Sequence[str] = ()
) -> TrainingRunInput:
    """Read and validate a run file (JSON, YAML or TOML: ``cairn.config_files``); a relative
    ``store`` is resolved here, once, against the starter's working directory (workers have
    their own, so the run input never holds one). ``overrides`` (top-level fields, from flags)
    replace the file's before validation, then ``sets`` (``--set a.b.c=VALUE``) apply."""
    doc = load_document(path, what="run file")
    data = doc.data
    if isinstance(data, dict) and overrides:
        data.update(overrides)
    data = apply_overrides(data, sets, TrainingRunInput)
    doc = doc.with_sets(sets)
    if isinstance(data, dict) and isinstance(data.get("store"), str):
        data["store"] = resolve_store_url(data["store"], cwd)
    effects = data.get("effects") if isinstance(data, dict) else None
    if isinstance(effects, dict) and isinstance(effects.get("registry"), str):
        effects["registry"] = resolve_store_url(effects["registry"], cwd)
    try:
        inp = TrainingRunInput.model_validate(data)
    except ValidationError as exc:
        error = config_error_from(exc, path, TrainingRunInput)
        raise config_error_from(exc, doc.where(error.field), TrainingRunInput) from None
    try:
        check_trainer_options(inp.config)  # where the trainer is installed here: its options, before starting
    except ConfigError as exc:
        raise ConfigError(f"{path}: config.{exc}") from None
    return inp


def sent_input(inp: TrainingRunInput) -> dict[str, Any]:
    """What ``cairn run start`` sends for a validated run input: the fields the run file and the
    flags set (``exclude_unset``: nested sections too), as resolved here (the absolute store
    path), and none of the defaults; the workflow's data converter validates it into the same
    ``TrainingRunInput``, defaults filled in there. So the Web UI's Input panel and ``describe``
    show the user's own file, not the built-in MLP's sections under a torch trainer. Should the
    payload ever validate into another input than ``inp``, the full input is sent instead."""
    payload = inp.model_dump(mode="json", exclude_unset=True)
    if TrainingRunInput.model_validate(payload) != inp:
        return inp.model_dump(mode="json")
    return payload
