"""Config and run files as JSON, YAML or TOML (``cairn.config_files``): one meaning whatever the
format, the same bounds and one-line errors (with the line), and ``--set`` overrides typed by the
schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from cairn.config import load_config
from cairn.config_files import MAX_MARKUP_BYTES, apply_overrides, load_document
from cairn.errors import ConfigError
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "config.json"

TOML = """
seed = 7
batch_size = 2
tokenizer_version = "none"
stage = "train"

[model]
kind = "mlp"
hidden = 16
init_scale = 1.0
version = "mlp-v1"

[data]
source = "synthetic"
seed = 11
n_examples = 256
n_features = 8
n_classes = 3
noise = 0.6
version = "synthetic-v1"

[optimizer]
kind = "adam"
lr = 0.02
beta1 = 0.9
beta2 = 0.999
eps = 1e-08
weight_decay = 0.001
warmup_steps = 5
decay = "cosine"
decay_steps = 200
min_lr_ratio = 0.1
"""


def test_the_same_config_in_json_yaml_and_toml_is_one_config(tmp_path: Path) -> None:
    as_yaml = tmp_path / "config.yaml"
    as_yaml.write_text(yaml.safe_dump(json.loads(EXAMPLE.read_text())))
    as_toml = tmp_path / "config.toml"
    as_toml.write_text(TOML)
    assert load_config(EXAMPLE) == load_config(as_yaml) == load_config(as_toml)
    assert (tmp_path / "config.yml").write_text(as_yaml.read_text()) and load_config(tmp_path / "config.yml")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "c.yaml",
            "seed: 7\nmodel:\n  hidden: 16\n  width: 3\n",
            "c.yaml:4: model.width: Extra inputs are not permitted",
        ),
        ("c.yaml", "seed: 7\noptimizer:\n  lr: fast\n", "c.yaml:3: optimizer.lr: Input should be a valid number"),
        ("c.json", '{\n  "seed": 7,\n  "optimizer": {\n    "lr": "fast"\n  }\n}\n', "c.json:4: optimizer.lr:"),
        ("c.toml", "seed = 7\n[optimizer]\nlr = 'fast'\n", "c.toml: optimizer.lr: Input should be a valid number"),
        ("c.toml", "seed = \n", "c.toml: not valid TOML"),
        ("c.yaml", "seed: [1,\n", "c.yaml: not valid YAML"),
    ],
)
def test_a_bad_file_is_one_line_naming_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{tmp_path}/{message}"), refused.value
    assert "\n" not in str(refused.value)


def test_yaml_means_one_thing(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("a: off\nb: no\nc: 2024-01-01\nd: true\ne: 1.5\n")
    assert load_document(path, what="run file").data == {"a": "off", "b": "no", "c": "2024-01-01", "d": True, "e": 1.5}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a: &x [1, 2]\nb: *x\n", "YAML aliases (*name) are not accepted"),
        ("a: !!binary aGVsbG8=\n", "a value JSON cannot hold"),
        ("a: .nan\n", "NaN"),
        ("a: !!python/object:os.system {}\n", "not valid YAML"),
        ("a: " + "[" * 200 + "]" * 200 + "\n", "nested too deep"),
    ],
)
def test_what_yaml_could_do_to_a_reader_is_refused(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_document(path, what="run file")
    assert why in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_a_huge_yaml_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_MARKUP_BYTES + 1)  # sparse: nothing is read to find its size
    with pytest.raises(ConfigError) as refused:
        load_document(path, what="config file")
    assert f"<= {MAX_MARKUP_BYTES} bytes" in str(refused.value), refused.value


def test_overrides_are_typed_by_the_schema(tmp_path: Path) -> None:
    config = load_config(EXAMPLE, ["optimizer.lr=3e-4", "model.hidden=4", "data.version=7", "optimizer.decay=linear"])
    assert (config.optimizer.lr, config.model.hidden) == (3e-4, 4)
    assert config.data.version == "7"  # a field that takes only strings keeps the text
    assert config.optimizer.decay == "linear"
    with pytest.raises(ConfigError) as wrong_type:
        load_config(EXAMPLE, ["model.hidden=wide"])
    assert "model.hidden: Input should be a valid integer" in str(wrong_type.value)
    with pytest.raises(ConfigError) as typo:
        load_config(EXAMPLE, ["optimizer.lrr=0.1"])
    assert "optimizer.lrr: Extra inputs are not permitted — did you mean 'lr'?" in str(typo.value)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["seed"], "--set: expected FIELD.PATH=VALUE"),
        (["seed.x=1"], "--set seed.x: expected a section at seed"),
        (["a.5.b=1"], "--set a.5.b: expected an index below 2 at a.5"),
    ],
)
def test_a_malformed_override_is_refused(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        apply_overrides({"seed": 7, "a": [{}, {}]}, sets)
    assert str(refused.value).startswith(message), refused.value


def test_overrides_walk_lists_and_create_sections() -> None:
    data = apply_overrides({"nodes": ["a", "b"]}, ["nodes.1=c", "checkpoint.every=auto", "checkpoint.keep_last=3"])
    assert data == {"nodes": ["a", "c"], "checkpoint": {"every": "auto", "keep_last": 3}}


def test_yaml_numbers_are_yaml_1_2s(tmp_path: Path) -> None:
    """No YAML 1.1 octal or base-60: ``010`` is ten and ``12:30`` a string (YAML 1.1 read them as
    8 and 750, and base-60 costs quadratic time in the reader)."""
    path = tmp_path / "r.yaml"
    path.write_text("a: 010\nb: 12:30\nc: 0x1f\nd: 0o17\ne: 1e3\nf: -7\ng: .5\n")
    assert load_document(path, what="run file").data == {
        "a": 10, "b": "12:30", "c": 31, "d": 15, "e": 1000.0, "f": -7, "g": 0.5,
    }  # fmt: skip


@pytest.mark.parametrize(("name", "text"), [("c.yaml", "seed: {}\n"), ("c.toml", "seed = {}\n")])
def test_an_integer_past_pythons_conversion_limit_is_one_line(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text.format("1" * 5000))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}: ") and "\n" not in str(refused.value), refused.value


def test_an_error_in_an_override_names_the_override_not_a_line_of_the_file() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(EXAMPLE, ["model.hidden=wide"])
    assert str(refused.value).startswith("--set: model.hidden: Input should be a valid integer"), refused.value
    with pytest.raises(ConfigError) as in_file:
        load_config(EXAMPLE, ["model.hidden=8", "optimizer.lr=fast"])
    assert str(in_file.value).startswith("--set: optimizer.lr"), in_file.value


def test_override_values_are_bounded_and_null_clears_an_optional_field() -> None:
    with pytest.raises(ConfigError) as deep:
        apply_overrides({}, ["a=" + "[" * 100_000])
    assert "nested too deep" in str(deep.value), deep.value
    with pytest.raises(ConfigError):
        apply_overrides({"a": [1, 2]}, ["a.\u00b2=3"])  # a superscript two is no index
    assert apply_overrides({"x": "y"}, ["x=null"], _Optional) == {"x": None}
    assert apply_overrides({"x": "y"}, ["x=null"], _Required) == {"x": "null"}


class _Optional(BaseModel):
    x: str | None = None


class _Required(BaseModel):
    x: str
