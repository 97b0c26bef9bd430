"""The environment variables Cairn reads, one table: each variable's name, who reads it and what
it means. The reference page is rendered from it, and ``tests/unit/docs/test_reference.py`` scans
the code for every variable read (``os.environ``/``getenv`` and ``CAIRN_*`` names) and fails when
one is missing here or listed here but read nowhere."""

from __future__ import annotations

from typing import NamedTuple

from workers.reference.markdown import table

__all__ = ["INTERNAL", "VARIABLES", "Variable", "page"]


class Variable(NamedTuple):
    name: str
    read_by: str
    meaning: str
    library: str = ""
    """Who reads it when Cairn's own code does not: ``boto3``, ``temporalio.envconfig``."""


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "TEMPORAL_ADDRESS",
        "CLI, workers, `cairn drill --stack env`",
        "the Temporal frontend `host:port` (default `127.0.0.1:7233`); `--address` overrides it",
    ),
    Variable(
        "TEMPORAL_NAMESPACE", "CLI, workers", "the Temporal namespace (default `default`); `--namespace` overrides it"
    ),
    Variable(
        "TEMPORAL_API_KEY",
        "CLI, workers",
        "an API key for Temporal Cloud, read as the `temporal` CLI reads it",
        "temporalio.envconfig",
    ),
    Variable(
        "TEMPORAL_TLS_*",
        "CLI, workers",
        "TLS settings of the Temporal connection (`TEMPORAL_TLS_CLIENT_CERT_PATH`, ...), as the `temporal` CLI",
        "temporalio.envconfig",
    ),
    Variable(
        "TEMPORAL_PROFILE",
        "CLI, workers",
        "the profile of the `temporal` CLI's config file to use",
        "temporalio.envconfig",
    ),
    Variable(
        "AWS_ENDPOINT_URL_S3",
        "everything that opens an `s3://` store",
        "the S3 endpoint (`--endpoint-url` sets it for one command); else `AWS_ENDPOINT_URL`, else boto3's default",
    ),
    Variable(
        "AWS_ENDPOINT_URL", "everything that opens an `s3://` store", "the endpoint when `AWS_ENDPOINT_URL_S3` is unset"
    ),
    Variable("AWS_ACCESS_KEY_ID", "everything that opens an `s3://` store", "S3 credentials (boto3's chain)"),
    Variable("AWS_SECRET_ACCESS_KEY", "everything that opens an `s3://` store", "S3 credentials (boto3's chain)"),
    Variable("AWS_DEFAULT_REGION", "everything that opens an `s3://` store", "the S3 region (boto3's chain)"),
    Variable(
        "AWS_PROFILE", "everything that opens an `s3://` store", "the profile of boto3's shared config to use", "boto3"
    ),
    Variable(
        "CAIRN_SIGNING_KEY",
        "every command, worker activity, `TrainingSession` and gang rank (read once)",
        "HMAC key that signs committed checkpoints and is required on import (set but empty is an error)",
    ),
    Variable(
        "CAIRN_SIGNING_KEY_FILE", "as `CAIRN_SIGNING_KEY`", "a file holding the signing key, instead of the key itself"
    ),
    Variable(
        "CAIRN_MAX_CHECKPOINT_BYTES",
        "read with the signing key",
        "the ceiling on a checkpoint's total bytes for readers that do not know the run (default `64TiB`; "
        "an integer or a `KiB`…`PiB` suffix); a training import is bounded by its trainer's declared sizes under it",
    ),
    Variable(
        "CAIRN_INCREMENTAL",
        "workers, gang ranks",
        "`1`: incremental checkpoints (unchanged blocks referenced, not rewritten) for runs whose "
        "`checkpoint.incremental` is unset",
    ),
    Variable(
        "CAIRN_COMPRESSION",
        "workers, gang ranks, `cairn train`",
        "`off` (default), `zstd` or `auto`: lossless checkpoint compression for saves whose "
        "`checkpoint.compression` is unset (restores read any checkpoint whatever it says)",
    ),
    Variable(
        "CAIRN_NUMERICS",
        "every process that computes",
        "the numerics profile this process is pinned to (`x86-64-v2`, `x86-64-v3`, `x86-64-v4`, `native`); "
        "`--numerics` sets it",
    ),
    Variable(
        "CAIRN_TRAINERS",
        "everything that imports a trainer",
        "comma-separated trainer import paths trusted besides the ones shipped with Cairn",
    ),
    Variable("CAIRN_PRELOAD", "workers", "comma-separated modules a worker imports before it polls (`--preload`)"),
    Variable(
        "CAIRN_NODE", "workers", "this host's name in runs' `nodes`: the worker also polls `QUEUE@NAME` (`--node`)"
    ),
    Variable(
        "CAIRN_ADVERTISE_ADDR",
        "workers (gangs)",
        "the address other hosts reach this one's rank 0 at (`--advertise-addr`)",
    ),
    Variable(
        "CAIRN_WORKER_ID",
        "workers",
        "this worker's id, in logs and in its own task queue's name (default: a random id; "
        "a supervisor passes the same id to the worker it restarts)",
    ),
    Variable(
        "CAIRN_WARM_RUNS", "workers", "runs a worker keeps warm in memory (default 2; `0` turns warm segments off)"
    ),
    Variable(
        "CAIRN_LOCAL_TIER", "workers", "a node-local directory that holds a copy of recent checkpoints (`--local-tier`)"
    ),
    Variable("CAIRN_LOCAL_TIER_BYTES", "workers", "the local tier's size bound, e.g. `20GiB` (`--local-tier-bytes`)"),
    Variable("CAIRN_METRICS_PORT", "workers", "the Prometheus endpoint's port (default `9464`; `0` any free; `off`)"),
    Variable("CAIRN_LOG_FORMAT", "workers", "`text` (default) or `json` log lines"),
    Variable("CAIRN_S3_MAX_ATTEMPTS", "everything that opens an `s3://` store", "attempts per S3 request (default 9)"),
    Variable(
        "CAIRN_S3_BACKOFF_CAP_S",
        "everything that opens an `s3://` store",
        "the longest wait between S3 attempts, in seconds (default 20)",
    ),
    Variable(
        "CAIRN_S3_MAX_INFLIGHT",
        "everything that opens an `s3://` store",
        "S3 requests in flight per process (default 64)",
    ),
    Variable(
        "CAIRN_S3_MAX_INFLIGHT_HOST",
        "everything that opens an `s3://` store",
        "S3 requests in flight per host, split over torchrun's `LOCAL_WORLD_SIZE` ranks",
    ),
    Variable(
        "LOCAL_WORLD_SIZE", "gang ranks (set by torchrun)", "ranks on this host: divides `CAIRN_S3_MAX_INFLIGHT_HOST`"
    ),
    Variable("RANK", "gang ranks (set by torchrun)", "this process's rank"),
    Variable("LOCAL_RANK", "gang ranks (set by torchrun)", "this process's rank on its host (its GPU on CUDA)"),
    Variable(
        "CAIRN_STATE_DIR",
        "`cairn dev`, `make demo`",
        "where the dev stack keeps its data, logs and pid files (else `$XDG_STATE_HOME/cairn`, "
        "else `~/.local/state/cairn`)",
    ),
    Variable(
        "XDG_STATE_HOME",
        "`cairn dev`, `make demo`",
        "the base of the dev stack's state when `CAIRN_STATE_DIR` is unset",
    ),
    Variable(
        "XDG_CACHE_HOME",
        "trainers that read data files (`DataFiles`)",
        "the base of the data files' content-hash cache (`$XDG_CACHE_HOME/cairn/data-hashes`, "
        "else `~/.cache/cairn/data-hashes`) when `hash_cache` is unset",
    ),
    Variable(
        "CAIRN_RESERVATION_URL",
        "set by `cairn dev up`",
        "the local reservation service, for run files' `effects.service_url`",
    ),
    Variable(
        "MLFLOW_ALLOW_FILE_STORE",
        "the MLflow tracker (`trackers`, `cairn trackers --mlflow file:...`)",
        "set to `true` (unless already set) when a tracker names a `file:` MLflow store, which MLflow 3 "
        "refuses without it",
        "mlflow",
    ),
    Variable("CAIRN_FAULT", "workers, gang ranks", "drill fault hook: crash at a named point (`cairn/faults.py`)"),
    Variable(
        "CAIRN_FAULT_ONCE", "workers, gang ranks", "a marker file that makes `CAIRN_FAULT` fire once across processes"
    ),
    Variable("CAIRN_TEST_ARTIFACTS", "tests", "where the browser test keeps its screenshots"),
    Variable("CAIRN_CHROMIUM", "tests", "the Chromium the browser test drives (default `/usr/bin/chromium`)"),
)
"""Every variable a user may set or meet, in the order the page lists them."""

INTERNAL: dict[str, str] = {
    "CAIRN_GANG_PARENT": "set by a gang's agent for its ranks: the pid they watch",
    "CAIRN_SUPERVISOR": "set by the worker supervisor for its worker: `PID:FD` of their channel",
    "CAIRN_NUMERICS_REEXEC": "set when a process re-executes itself under its numerics profile",
    "CUBLAS_WORKSPACE_CONFIG": "set by the PyTorch adapter on CUDA (`:4096:8`, what deterministic cuBLAS needs) "
    "unless the environment sets it",
}
"""Variables Cairn sets for its own child processes; never set them by hand."""


def page() -> str:
    out = [
        "# Environment variables",
        "",
        "Every environment variable Cairn reads. The table is kept in the code",
        "(`workers/reference/environment.py`) and a test checks it against every variable the code reads.",
        "",
        table(("variable", "read by", "meaning"), ((f"`{v.name}`", v.read_by, v.meaning) for v in VARIABLES)),
        "",
        "## Set by Cairn for its own processes",
        "",
        table(("variable", "meaning"), ((f"`{name}`", meaning) for name, meaning in INTERNAL.items())),
    ]
    return "\n".join(out) + "\n"
