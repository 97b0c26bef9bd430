"""The benchmarks, in the order of their sections in ``BENCHMARKS.md``: the one table that the
runner (``bench.run_all``) and the report (``bench.report``) read.

An entry ``NAME`` is measured by ``bench/suites/NAME.py`` (``python -m bench.suites.NAME``,
which writes ``results/NAME.json``) and rendered by ``bench/sections/NAME.py`` (``async``'s
modules are ``async_save``: ``async`` is a keyword).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BENCHMARKS", "Benchmark", "by_name"]


@dataclass(frozen=True)
class Benchmark:
    name: str
    section: int
    """Its section's number in ``BENCHMARKS.md``."""
    title: str
    """Its section's heading after the number; ``{field}``s come from the section module's
    ``title_fields(results)``."""
    plot: str | None = None
    """The alt text of ``results/NAME.png``, shown under the section; None: no plot."""
    placeholder: bool = False
    """When its results are missing the document says "not measured" (otherwise leaves it out)."""
    needs_gpu: bool = False
    """Run by ``make gpu-check`` on a machine with a CUDA GPU, not by ``make bench``."""
    module: str | None = None
    """Its modules' name in ``suites/`` and ``sections/`` where that is not ``name`` (a keyword)."""

    @property
    def suite(self) -> str:
        return f"bench.suites.{self.module or self.name}"

    @property
    def renderer(self) -> str:
        return f"bench.sections.{self.module or self.name}"

    def heading(self, fields: Mapping[str, str]) -> str:
        return f"## {self.section}. {self.title.format_map(fields)}"


BENCHMARKS = (
    Benchmark("store", 1, "Save and restore vs the floor", plot="save/restore vs the floor", placeholder=True),
    Benchmark("peers", 2, "Peers on the same bytes, same disk, same run", plot="peers", placeholder=True),
    Benchmark("async", 3, "Async save", placeholder=True, module="async_save"),
    Benchmark(
        "orchestration", 4, "Orchestration: Temporal vs the in-process loop", plot="orchestration", placeholder=True
    ),
    Benchmark("recovery", 5, "Recovery after SIGKILL", plot="recovery", placeholder=True),
    Benchmark("scale", 6, "Scale", plot="scale"),
    Benchmark("distributed", 7, "Distributed checkpoints", plot="distributed checkpoints"),
    Benchmark("numerics", 8, "Numerics profiles: the cost of pinning"),
    Benchmark("precision", 9, "Mixed precision: bfloat16 vs float32 checkpoints", plot="bf16 vs fp32 vs the floor"),
    Benchmark("recovery_supervised", 10, "Recovery with a supervisor", plot="recovery with a supervisor"),
    Benchmark("interop", 11, "Export to Hugging Face: `cairn ckpt export --format safetensors` vs `save_pretrained`"),
    Benchmark("gpu", 12, "Checkpoints from GPU memory", needs_gpu=True),
    Benchmark("history", 13, "History per save at a million steps"),
    Benchmark(
        "metadata",
        14,
        "Metadata at scale: a 70B-class checkpoint over 1,024 ranks, in simulation",
        plot="root manifest and rank index bytes vs ranks",
    ),
    Benchmark(
        "large",
        15,
        "The largest state this machine holds: {size} saved and restored for real",
        plot="large state vs the floor",
    ),
    Benchmark(
        "boundaries",
        16,
        "Segment boundaries on a timeline: the digits CNN and the LM example",
        plot="segment boundaries",
    ),
    Benchmark("incremental", 17, "Incremental checkpoints: writing what changed", plot="incremental checkpoints"),
    Benchmark("tier", 18, "A fast local tier in front of S3"),
    Benchmark(
        "finetune",
        19,
        "Fine-tuning: data that outgrows memory, LoRA, the loader",
        plot="build and verify time vs dataset size",
    ),
    Benchmark(
        "fsdp",
        20,
        "FSDP2: per-rank checkpoints vs the floor, peak RSS, resharding vs DCP, the cost of sharding",
        plot="FSDP saves and restores per rank, peak RSS, resharding, step time",
    ),
    Benchmark(
        "compression",
        21,
        "Compression: fewer bytes than the floor",
        plot="compressed and raw checkpoints vs the raw-bytes floor on S3, auto vs off on local disk",
    ),
)


def by_name(names: list[str] | None = None) -> list[Benchmark]:
    """The benchmarks named, in that order (all of them, in the table's order, when ``names`` is
    None); an unknown name is an error."""
    if names is None:
        return list(BENCHMARKS)
    known = {b.name: b for b in BENCHMARKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    return [known[n] for n in names]
