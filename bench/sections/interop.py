# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 11 of ``BENCHMARKS.md`` (export to Hugging Face vs ``save_pretrained``; no plot: two
numbers read better in the table), from the results of ``bench.suites.interop``."""

from __future__ import annotations

from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    m, mach, res = r["model"], r["machine"], r["results"]
    ours, theirs = res["cairn export"], res["load_training + save_pretrained"]
    ratio = theirs["seconds"]["median"] / ours["seconds"]["median"]
    out = [
        f"A GPT-2 of {m['params'] / 1e6:.1f}M parameters ({m['n_layer']} layers, width {m['n_embd']}, head tied; "
        f"{m['weight_bytes'] / 1e6:.0f} MB of float32 weights) built from its config by `cairn.trainers.hf`. Ours: "
        "the export streams the committed checkpoint's blocks from the store (pages evicted first: read from the "
        "device), verifies every checksum and writes `model.safetensors`, `config.json` and the tokenizer through "
        "one 8 MiB buffer, fsync'd. Theirs: `save_pretrained` of the live model (from memory: no checkpoint read, a "
        "lower bound), and what a user without the export does — restore the checkpoint (`load_training`, "
        "validated, from the device) into the model, then `save_pretrained`; fsync'd. Median "
        f"(min–max) of {r['reps']} interleaved reps on {mach['cpu']} ({mach['cores']} cores, load average "
        f"{mach['loadavg_at_start'][0]:.1f}). Peak RSS: one of each in a fresh process, above its RSS once the "
        "model is built, in weight bytes.",
        "",
        "| writer | seconds | MB/s | peak RSS over the built model |",
        "|---|---|---|---|",
    ]
    for name, x in res.items():
        s = x["seconds"]
        out.append(
            f"| {name} | {spread(s)} | {m['weight_bytes'] / 1e6 / s['median']:.0f} | "
            f"{x['rss']['peak_extra'] / MiB:.0f} MiB ({x['rss']['ratio_to_weights']:.2f}×) |"
        )
    out += ["", f"(load_training + save_pretrained) seconds / export seconds: **{ratio:.2f}×**.", ""]
    targets.add(
        "export memory bounded (no full copy)",
        f"{ours['rss']['peak_extra'] / MiB:.0f} MiB over the model ({ours['rss']['ratio_to_weights']:.2f}× the weights)",
        ours["rss"]["ratio_to_weights"] < 0.25,
        "section 11",
    )
    return out
