"""The run-input and trainer-config reference pages, rendered from the JSON Schema of the pydantic
models that validate them (``cairn schema``'s output): every field with its type, default,
constraints and description, so the pages change when the models do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from workers.reference.markdown import prose, slug, table

__all__ = ["BUILT_IN_TRAINERS", "fields", "models", "page", "pages"]

BUILT_IN_TRAINERS = {
    "cairn.trainers.pytorch:TorchTrainer": "every PyTorch trainer (yours subclasses it; its own options add to these)",
    "cairn.trainers.hf:HFCausalLM": "the Hugging Face causal language model trainer",
    "examples.digits:DigitsCNN": "the digits CNN of the demo (`examples/digits.py`)",
}
"""The trainers whose ``trainer.options`` the trainer-config page lists (the built-in MLP has none)."""

_CONSTRAINTS = {
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "minLength": "length ≥ {}",
    "maxLength": "length ≤ {}",
    "minItems": "≥ {} items",
    "maxItems": "≤ {} items",
    "pattern": "matches `{}`",
}


def _type(node: dict[str, Any]) -> str:
    """A JSON Schema node as a short type expression; a model as a link to its section."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{slug(name)})"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            return " or ".join(_type(option) for option in node[key])
    kind = node.get("type")
    if kind == "array":
        inner = _type(node["items"]) if "items" in node else "any"
        text = f"list of {inner}"
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        text = f"map of string to {_type(node['additionalProperties'])}"
    elif isinstance(kind, list):
        text = " or ".join(kind)
    else:
        text = kind or "any"
    bounds = [form.format(node[key]) for key, form in _CONSTRAINTS.items() if key in node]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _default(spec: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in spec:
        return ""
    text = json.dumps(spec["default"])
    return f"`{text}`" if len(text) <= 40 else "see the model"


def fields(model: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """Each property of ``model``: name, type, default, description."""
    required = set(model.get("required", ()))
    for name, spec in model.get("properties", {}).items():
        yield f"`{name}`", _type(spec), _default(spec, name in required), prose(spec.get("description", ""))


def models(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The schema's root model, then each model it references, in the order first referenced."""
    defs = schema.get("$defs", {})
    order, queue, seen = [], [(schema.get("title", "root"), schema)], set()
    while queue:
        name, node = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        order.append((name, node))
        text = json.dumps(node.get("properties", {}))
        for ref in sorted(defs, key=lambda d: text.find(f'/$defs/{d}"') if f'/$defs/{d}"' in text else 1 << 30):
            if f'/$defs/{ref}"' in text and ref not in seen:
                queue.append((ref, defs[ref]))
    order += [(name, node) for name, node in defs.items() if name not in seen]
    return iter(order)


def _sections(schema: dict[str, Any], level: str = "##") -> list[str]:
    out: list[str] = []
    for name, node in models(schema):
        out += ["", f"{level} {name}", ""]
        if node.get("description"):
            out += [prose(node["description"]), ""]
        if node.get("properties"):
            out.append(table(("field", "type", "default", "meaning"), fields(node)))
        else:
            out.append(f"Any value of type {_type(node)}.")
    return out


def page(kind: str) -> str:
    from workers.cli.schema import schema

    title, lead, command = {
        "run-input": (
            "Run input",
            "The workflow's input: what a run file holds (`cairn run start RUN`, the `temporal` CLI's "
            "`--input`, the Web UI's form). Fields the workflow carries across continue-as-new "
            "(`carry`) are filled in by the workflow, never by hand.",
            "cairn schema run-input",
        ),
        "config": (
            "Trainer config",
            "The trainer config: `cairn train --config FILE` and a run input's `config`. The trainer's "
            "own `trainer.options` are listed per trainer below.",
            "cairn schema config [--trainer FACTORY]",
        ),
    }[kind]
    out = [
        f"# {title}",
        "",
        lead,
        "",
        f"Generated at build time from the pydantic models that validate it; `{command}` prints the same",
        "schema as JSON Schema for editors. Unknown fields are refused, with the closest valid name suggested.",
        *_sections(schema(kind)),
    ]
    if kind == "config":
        from cairn.trainers import trainer_options_model

        out += ["", "## Trainer options", "", "`trainer.options` of the built-in trainers."]
        for factory, who in BUILT_IN_TRAINERS.items():
            options = trainer_options_model(factory).model_json_schema()
            out += ["", f"### `{factory}`", "", f"Options of {who}."]
            out += _sections(options, "####")
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    return {"reference/run-input.md": page("run-input"), "reference/trainer-config.md": page("config")}
