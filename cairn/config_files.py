"""Config and run files as JSON, YAML or TOML, and ``--set a.b.c=VALUE`` overrides.

The format is chosen by the file's extension: ``.yaml``/``.yml`` YAML, ``.toml`` TOML, anything
else JSON (as before). Every format gets JSON's bounds (``cairn.jsonio``): a regular file read
under a size bound before it is decoded, then the decoded document goes through the same checks
as a JSON one (depth, integer length, string length, no NaN or infinity), so the same model
validation and the same one-line errors follow. YAML and TOML files are bounded to
``MAX_MARKUP_BYTES`` (their parsers build a node per value: a config is kilobytes).

YAML is read as its safe subset with three rules that keep a config meaning one thing: anchors'
aliases are refused (an alias can multiply a small file into a huge document); only
``true``/``false`` are booleans (YAML 1.1 would read ``off`` or ``no`` as ``false``); dates stay
strings. A validation error names the field and, for YAML and JSON files, the line it is on
(``run.yaml:7: checkpoint.every: ...``).

``--set`` overrides are applied to the decoded document before validation: ``a.b.c`` walks
sections (a list element by its index), creating missing ones; VALUE is a string where the field
takes only strings (``--set run_id=123`` is the run id ``"123"``), else read as JSON when it
parses (``10``, ``0.5``, ``true``, ``null``, ``[1, 2]``, ``{"k": 1}``) and as a string when it does
not (``--set checkpoint.every=auto``); the model then checks it like any value of the file.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from cairn.errors import CairnError, ConfigError, one_line
from cairn.jsonio import JsonLimits, parse_json, read_regular_file

__all__ = ["MAX_MARKUP_BYTES", "Document", "apply_overrides", "file_format", "load_document"]

MAX_MARKUP_BYTES = 256 << 10
"""The largest YAML or TOML file read (JSON files keep ``JsonLimits.max_bytes``): configs are
kilobytes, and the pure-Python YAML reader costs ~250 bytes of memory per byte it reads."""

Format = Literal["json", "yaml", "toml"]
_SUFFIXES: dict[str, Format] = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}


def file_format(path: str | Path) -> Format:
    return _SUFFIXES.get(Path(path).suffix.lower(), "json")


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """YAML's safe subset without aliases, timestamps, or YAML 1.1's extra booleans and numbers
    (``010`` is ten, not octal eight; ``12:30`` is a string, not base 60): YAML 1.2's core schema."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"line {mark.line + 1}: YAML aliases (*name) are not accepted in a config")
        return super().compose_node(parent, index)


_YAML_11_ONLY = tuple(f"tag:yaml.org,2002:{t}" for t in ("timestamp", "bool", "int", "float"))
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_11_ONLY]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))


def _construct_int(loader: Any, node: Any) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # a leading zero is decimal (YAML 1.2), not octal


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


MAX_LINE_MAP_BYTES = 256 << 10
"""Above this size a JSON file's error names the field but not its line (finding lines re-reads
the file with the pure-Python YAML reader: done only for an error, and only for a config-sized file)."""


@dataclass(frozen=True)
class Document:
    """A decoded config or run file, and where its values are (for error messages)."""

    data: Any
    path: str
    source: str | None = None
    """The file's text, kept to find lines when an error needs one (YAML and JSON)."""
    sets: tuple[str, ...] = ()
    """The ``--set`` paths applied: an error in one of them names ``--set``, not a line."""

    def lines(self) -> dict[tuple[str, ...], int]:
        """``(section, ..., field)`` -> 1-based line (computed on demand: for an error)."""
        if self.source is None or len(self.source) > MAX_LINE_MAP_BYTES:
            return {}
        try:
            node = _compose(self.source)
        except (yaml.YAMLError, RecursionError, ValueError):
            return {}  # JSON the YAML reader cannot follow: no lines
        return _lines(node) if node is not None else {}

    def line(self, field: str | None) -> int | None:
        """The line of ``field`` (``a.b.c``), or of its closest enclosing section that has one."""
        parts = tuple((field or "").split(".")) if field else ()
        lines = self.lines() if parts else {}
        while parts:
            if parts in lines:
                return lines[parts]
            parts = parts[:-1]
        return None

    def where(self, field: str | None) -> str:
        """``FILE:LINE`` of ``field``, or ``--set`` when a ``--set`` wrote it (or a section above it)."""
        if field and any(field == s or field.startswith(f"{s}.") for s in self.sets):
            return "--set"
        line = self.line(field)
        return self.path if line is None else f"{self.path}:{line}"

    def with_sets(self, sets: Sequence[str]) -> Document:
        return replace(self, sets=self.sets + tuple(item.partition("=")[0].strip() for item in sets))


def _lines(node: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            out[path] = key.start_mark.line + 1
            out.update(_lines(value, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            path = (*prefix, str(i))
            out[path] = value.start_mark.line + 1
            out.update(_lines(value, path))
    return out


def _compose(text: str) -> Any:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _decode_markup(raw: bytes, fmt: Format, where: str, error: type[CairnError]) -> tuple[Any, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (binary file?): invalid byte at offset {exc.start}") from None
    try:
        if fmt == "toml":
            return tomllib.loads(text), None
        node = _compose(text)
        loader = _Loader("")
        try:
            return (loader.construct_document(node) if node is not None else None), node
        finally:
            loader.dispose()
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML ({exc})") from None
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise error(f"{where}: nested too deep") from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise error(f"{where}: a value that cannot be read ({one_line(str(exc), 200)})") from None


def load_document(
    path: str | Path, *, what: str, error: type[CairnError] = ConfigError, limits: JsonLimits | None = None
) -> Document:
    """A config or run file in the format its extension names, under JSON's bounds (module doc)."""
    limits = limits or JsonLimits()
    fmt, where = file_format(path), str(path)
    if fmt == "json":
        raw = read_regular_file(path, what=what, max_bytes=limits.max_bytes, error=error)
        data = parse_json(raw, where=where, error=error, limits=limits)
        return Document(data, where, raw.decode("utf-8"))
    raw = read_regular_file(path, what=what, max_bytes=min(limits.max_bytes, MAX_MARKUP_BYTES), error=error)
    decoded, node = _decode_markup(raw, fmt, where, error)
    try:
        as_json = json.dumps(decoded, ensure_ascii=False, allow_nan=True).encode()
    except (TypeError, ValueError) as exc:  # bytes (!!binary), a TOML date, a set (!!set) ...
        raise error(f"{where}: a value JSON cannot hold ({exc})") from None
    # the same checks as a JSON file (its size bound doubled: the JSON spelling may be longer)
    data = parse_json(as_json, where=where, error=error, limits=replace(limits, max_bytes=2 * limits.max_bytes))
    return Document(data, where, raw.decode("utf-8") if fmt == "yaml" else None)


def _field_type(model: object, parts: Sequence[str]) -> object:
    """The annotation at ``parts`` under ``model`` (None where the path leaves the models)."""
    current: object = model
    for part in parts:
        models = _models(current)
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if not fields:
            if get_origin(current) in (list, tuple, dict) and get_args(current):
                current = get_args(current)[-1]  # an element of a list, a value of a dict
                continue
            return None
        current = fields[0].annotation
    return current


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def _takes_only_strings(annotation: object) -> bool:
    """``str``, a ``Literal`` of strings, or a union / ``Annotated`` of those (None allowed)."""
    origin = get_origin(annotation)
    if annotation is str:
        return True
    if origin is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    if origin is Annotated:
        return _takes_only_strings(get_args(annotation)[0])
    if origin in (Union, UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return bool(options) and all(_takes_only_strings(a) for a in options)
    return False


def _value(text: str, annotation: object, name: str) -> Any:
    if text == "null" and _allows_none(annotation):
        return None
    if _takes_only_strings(annotation):
        return text
    try:
        return parse_json(text.encode(), where=f"--set {name}")  # JSON's bounds (depth, NaN, length)
    except ConfigError as exc:
        if "not valid JSON" in str(exc):
            return text  # a word: the model decides whether the field takes it
        raise


def _allows_none(annotation: object) -> bool:
    if get_origin(annotation) is Annotated:
        return _allows_none(get_args(annotation)[0])
    return get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation)


def apply_overrides(data: Any, sets: Sequence[str], model: object = None, flag: str = "--set") -> Any:
    """``data`` with each ``a.b.c=VALUE`` of ``sets`` applied (module doc); ``model`` types them."""
    if not sets:
        return data
    if not isinstance(data, dict):
        raise ConfigError(flag, expected="a file whose top level is an object", found=type(data).__name__)
    for item in sets:
        name, eq, text = item.partition("=")
        parts = name.strip().split(".")
        if not eq or not all(parts):
            raise ConfigError(flag, expected="FIELD.PATH=VALUE (e.g. checkpoint.every=10)", found=item)
        node: Any = data
        for depth, part in enumerate(parts[:-1]):
            here = ".".join(parts[: depth + 1])
            if isinstance(node, list):
                if not (part.isascii() and part.isdigit()) or int(part) >= len(node):
                    raise ConfigError(f"{flag} {name}", expected=f"an index below {len(node)} at {here}", found=part)
                node = node[int(part)]
                continue
            child = node.setdefault(part, {})
            if not isinstance(child, dict | list):
                raise ConfigError(f"{flag} {name}", expected=f"a section at {here}", found=json.dumps(child)[:80])
            node = child
        value = _value(text, _field_type(model, parts), name)
        last = parts[-1]
        if isinstance(node, list):
            if not (last.isascii() and last.isdigit()) or int(last) >= len(node):
                raise ConfigError(f"{flag} {name}", expected=f"an index below {len(node)}", found=last)
            node[int(last)] = value
        else:
            node[last] = value
    return data
