"""``cairn schema run-input|config [--trainer FACTORY]``: the JSON Schema of a run file or a
trainer config, generated from the models that validate them, for editors (VS Code's YAML and
JSON support, ``yaml-language-server``) and CI checks.

With ``--trainer`` the trainer's own options model fills ``trainer.options`` (its definitions
under ``$defs`` as ``trainer.NAME``) and ``trainer.factory`` is that trainer; without it the
options are any object (the trainer checks them when it is loaded).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import BaseModel

from activities.inputs import TrainingRunInput
from cairn.config import TrainConfig
from cairn.trainers import trainer_options_model
from workers.cli.args import Common

__all__ = ["KINDS", "register", "schema"]

KINDS: dict[str, type[BaseModel]] = {"run-input": TrainingRunInput, "config": TrainConfig}
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def register(sub: Any, common: Common) -> None:
    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of a run file or a trainer config (for editors)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(p)
    p.add_argument("kind", choices=tuple(KINDS), help="run-input: a run file (cairn run start); config: --config")
    p.add_argument("--trainer", metavar="FACTORY", help="module:Class whose options fill trainer.options")
    p.set_defaults(handler=show)


def schema(kind: str, trainer: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``kind``, with ``trainer``'s options when given."""
    out = KINDS[kind].model_json_schema()
    if trainer is not None:
        options = trainer_options_model(trainer).model_json_schema(ref_template="#/$defs/trainer.{model}")
        defs = out.setdefault("$defs", {})
        defs.update({f"trainer.{name}": body for name, body in options.pop("$defs", {}).items()})
        spec = defs["TrainerSpec"]
        spec["properties"]["options"] = options
        spec["properties"]["factory"] = {**spec["properties"]["factory"], "const": trainer}
        if kind == "config":
            out["required"] = sorted({*out.get("required", []), "trainer"})
        else:
            defs["TrainConfig"]["required"] = sorted({*defs["TrainConfig"].get("required", []), "trainer"})
    return {"$schema": DIALECT, **out}


def show(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.kind, args.trainer), indent=2))  # a schema is JSON, --json or not
    return 0
