"""``cairn dev up | down | status | env``: the local stack, in the background.

Starts a Temporal dev server (persistent SQLite file, Web UI), a SeaweedFS S3 server, the
reservation service (when available) and one supervised worker (``cairn worker``, its settings
from the trainer the stack is configured with: ``workers.stack.devworker``), and returns once the
worker polls. Data, logs, pid files and ``stack.json`` live under the state folder, outside any
checkout (``default_state_dir``). ``up`` is idempotent: with the stack up it starts nothing and
says so; it starts again only a part that died, naming it. ``down`` stops only what ``up`` started
(it checks each pid's command line first). ``env`` prints what a worker started by hand needs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.cli.output import to_json
from workers.stack.devworker import DevWorker, dev_worker
from workers.stack.servers import (
    ServerProcess,
    find_binary,
    seaweedfs_command,
    stop_pid,
    temporal_command,
    wait_for_http,
    wait_for_log,
    wait_for_temporal,
)

__all__ = [
    "register",
    "StackConfig",
    "stack_up",
    "stack_down",
    "stack_status",
    "stack_env",
    "env_lines",
    "worker_argv",
    "default_state_dir",
]

STATE_DIR_ENV = "CAIRN_STATE_DIR"
REPO = Path(__file__).resolve().parents[2]
WORKER_READY_S = 180.0
"""How long ``up`` waits for its worker to poll (a torch trainer's preload takes seconds)."""
BUCKET_WAIT_SECONDS = 30.0
"""How long a new SeaweedFS may refuse to create the stack's bucket before ``up`` fails."""


def default_state_dir() -> Path:
    """Where the dev stack and the demo keep their state: ``$CAIRN_STATE_DIR``, else
    ``$XDG_STATE_HOME/cairn``, else ``~/.local/state/cairn`` — never inside the checkout."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV]).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return (Path(base).expanduser() / "cairn").resolve()


S3_BUCKET = "cairn"


@dataclass
class StackConfig:
    state_dir: Path
    temporal_port: int = 7233
    ui_port: int = 8233
    s3_port: int = 8333
    service_port: int = 8377
    task_queue: str = "cairn-training"
    worker: bool = True
    dev_worker: DevWorker = field(default_factory=DevWorker)
    """The worker's settings (``cairn dev up --config``)."""

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"


def stack_env(cfg: StackConfig) -> dict[str, str]:
    """Environment for processes (and users) talking to this stack."""
    return {
        "TEMPORAL_ADDRESS": cfg.temporal_address,
        "AWS_ENDPOINT_URL_S3": cfg.s3_endpoint,
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "cairn-dev"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "cairn-dev-secret"),
        "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        "CAIRN_RESERVATION_URL": cfg.service_url,
    }


def env_lines(env: dict[str, str], worker_command: str) -> list[str]:
    """``export`` lines for a shell (``eval "$(cairn dev env)"``), and the worker to start there."""
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()] + [f"# a worker started by hand: {worker_command}"]


def worker_argv(cfg: StackConfig) -> list[str]:
    """The dev worker: ``cairn worker`` (a supervisor, so a crashed worker process's segment is
    retried at once) on the stack's queue, with its settings' flags."""
    return [
        sys.executable,
        "-m",
        "workers.cli",
        "worker",
        "--address",
        cfg.temporal_address,
        "--task-queue",
        cfg.task_queue,
        *cfg.dev_worker.flags(),
    ]


def _pid_file(cfg: StackConfig, name: str) -> Path:
    return cfg.state_dir / "pids" / f"{name}.pid"


def _record(cfg: StackConfig, name: str) -> dict[str, Any] | None:
    try:
        record = json.loads(_pid_file(cfg, name).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _running(cfg: StackConfig, name: str) -> int | None:
    """The pid recorded for ``name`` if that process is alive and is the one we started."""
    record = _record(cfg, name)
    if record is None:
        return None
    try:
        pid, marker = int(record["pid"]), str(record["marker"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if marker and marker in cmdline else None


Ready = Callable[[ServerProcess, int], None]
"""Waits until a started server serves (given the process and its log's size before the start)."""


def _services(cfg: StackConfig) -> list[tuple[str, list[str], Ready, str]]:
    """(name, argv, wait-until-ready, marker found in its command line)."""
    data = cfg.state_dir / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    services: list[tuple[str, list[str], Ready, str]] = [
        (
            "temporal",
            temporal_command(cfg.temporal_port, cfg.ui_port, cfg.state_dir / "temporal.db"),
            lambda p, _: wait_for_temporal("127.0.0.1", cfg.temporal_port, 90, p.alive),
            f"--port {cfg.temporal_port}",
        ),
        (
            "seaweedfs",
            seaweedfs_command(data, cfg.s3_port),
            lambda p, _: wait_for_http(cfg.s3_endpoint + "/", 90, p.alive),
            f"-s3.port={cfg.s3_port}",
        ),
    ]
    if _has_reservation_service():
        services.append(
            (
                "reservation",
                [
                    sys.executable,
                    "-m",
                    "workers.stack.reservation",
                    "--port",
                    str(cfg.service_port),
                    "--db",
                    str(cfg.state_dir / "reservations.db"),
                ],
                lambda p, _: wait_for_http(cfg.service_url + "/health", 30, p.alive),
                f"--port {cfg.service_port}",
            )
        )
    if cfg.worker:
        services.append(
            (
                "worker",
                worker_argv(cfg),
                lambda p, offset: wait_for_log(p.log_path, "polling ", offset, WORKER_READY_S, p.alive),
                f"--task-queue {cfg.task_queue}",
            )
        )
    return services


def _has_reservation_service() -> bool:
    return importlib.util.find_spec("workers.stack.reservation") is not None


@contextlib.contextmanager
def _stack_lock(cfg: StackConfig) -> Iterator[None]:
    """One ``up`` or ``down`` at a time per state folder: two ``up``s at once start one stack."""
    with open(cfg.state_dir / "stack.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def stack_up(cfg: StackConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Start what is not running; return what the stack is (``stack.json``), with which parts
    this call started (``started``), started again after they died (``restarted``), and
    ``already_up`` when it started nothing."""
    (cfg.state_dir / "pids").mkdir(parents=True, exist_ok=True)
    env = stack_env(cfg)
    started: list[str] = []
    restarted: list[str] = []
    with _stack_lock(cfg):
        for name, argv, ready, marker in _services(cfg):
            pid = _running(cfg, name)
            if pid is not None:
                echo(f"{name:<12} already running (pid {pid})")
                record = _record(cfg, name) or {}
                if name == "worker" and record.get("argv") != argv:
                    echo(
                        f"{'':<12} with other settings ({record.get('command', '?')}); to run it as "
                        f"`{cfg.dev_worker.command()}`: `cairn dev down`, then `cairn dev up` again"
                    )
                continue
            died = _record(cfg, name)
            log = cfg.state_dir / "logs" / f"{name}.log"
            offset = log.stat().st_size if log.exists() else 0
            proc = ServerProcess(name, argv, log, env=env, cwd=REPO).start()
            try:
                ready(proc, offset)
            except (TimeoutError, RuntimeError) as exc:
                proc.stop()
                raise RuntimeError(f"{name} did not come up: {exc}\n{proc.log_tail(15)}") from exc
            record = {"pid": proc.pid, "marker": marker, "argv": argv}
            if name == "worker":
                record["command"] = cfg.dev_worker.command()
            _pid_file(cfg, name).write_text(json.dumps(record))
            if died is None:
                started.append(name)
                echo(f"{name:<12} started (pid {proc.pid}), log {proc.log_path}")
            else:
                restarted.append(name)
                echo(f"{name:<12} not running (pid {died.get('pid')} is gone): restarted (pid {proc.pid}), log {log}")
            if name == "seaweedfs":
                _ensure_bucket(cfg)
        if not started and not restarted:
            echo("the stack is already up: nothing started")
        elif restarted and not started:
            echo("the stack was up but for: " + ", ".join(f"{n} (restarted)" for n in restarted))
        info = {
            "temporal": cfg.temporal_address,
            "web_ui": f"http://127.0.0.1:{cfg.ui_port}",
            "s3_endpoint": cfg.s3_endpoint,
            "s3_store": f"s3://{S3_BUCKET}/runs",
            "reservation_service": cfg.service_url if _has_reservation_service() else None,
            "task_queue": cfg.task_queue,
            "state_dir": str(cfg.state_dir),
            "env": env,
            "worker_command": _worker_command(cfg),
            "started": started,
            "restarted": restarted,
            "already_up": not started and not restarted,
        }
        (cfg.state_dir / "stack.json").write_text(json.dumps(info, indent=1))
    return info


def _worker_command(cfg: StackConfig) -> str:
    """How to start a worker by hand like the stack's: the running one's settings, else these."""
    record = _record(cfg, "worker") if _running(cfg, "worker") is not None else None
    return str(record["command"]) if record and "command" in record else cfg.dev_worker.command()


def _ensure_bucket(cfg: StackConfig) -> None:
    from cairn.errors import StorageError
    from cairn.stores import S3Store

    env = stack_env(cfg)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        os.environ.setdefault(key, env[key])
    store = S3Store(S3_BUCKET, endpoint_url=cfg.s3_endpoint)
    # SeaweedFS answers on its S3 port before its filer is ready: a create then fails "not
    # found" for a few seconds (seen in CI-like runs). Wait for the bucket, not a fixed time.
    deadline = time.monotonic() + BUCKET_WAIT_SECONDS
    while True:
        try:
            store.ensure_bucket()
            return
        except StorageError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)


def stack_down(cfg: StackConfig, echo: Callable[[str], None] = print) -> None:
    if not cfg.state_dir.is_dir():
        return
    with _stack_lock(cfg):
        for name in ("worker", "reservation", "seaweedfs", "temporal"):
            pid = _running(cfg, name)
            if pid is None:
                if _pid_file(cfg, name).exists():
                    echo(f"{name:<12} not running (stale pid file removed)")
                    _pid_file(cfg, name).unlink()
                continue
            # The worker gets time to checkpoint running segments; SeaweedFS is slow on SIGTERM.
            stop_pid(pid, grace={"worker": 35.0, "seaweedfs": 2.0}.get(name, 5.0))
            _pid_file(cfg, name).unlink(missing_ok=True)
            echo(f"{name:<12} stopped (pid {pid})")


def stack_status(cfg: StackConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("temporal", "seaweedfs", "reservation", "worker"):
        pid = _running(cfg, name)
        out[name] = {"running": pid is not None, "pid": pid, "log": str(cfg.state_dir / "logs" / f"{name}.log")}
    return out


def _cfg(args: argparse.Namespace) -> StackConfig:
    return StackConfig(
        state_dir=Path(args.state_dir).resolve() if args.state_dir else default_state_dir(),
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        s3_port=args.s3_port,
        service_port=args.service_port,
        worker=not args.no_worker,
        dev_worker=dev_worker(getattr(args, "config", None)),
    )


def _up(args: argparse.Namespace) -> int:
    find_binary("temporal"), find_binary("weed")
    info = stack_up(_cfg(args), echo=(lambda s: None) if args.json else print)
    if args.json:
        print(to_json(info))
        return 0
    print(f"\nTemporal   {info['temporal']}   Web UI {info['web_ui']}")
    print(f"S3         {info['s3_endpoint']}  (store {info['s3_store']})")
    if info["reservation_service"]:
        print(f"Service    {info['reservation_service']}")
    print(f"State      {info['state_dir']}  (data, logs, pid files; `cairn dev down` stops the stack)")
    print('To use the stack from a shell (`eval "$(cairn dev env)"` prints the same):')
    for line in env_lines(info["env"], info["worker_command"]):
        print(f"  {line}")
    return 0


def _down(args: argparse.Namespace) -> int:
    stack_down(_cfg(args), echo=(lambda s: None) if args.json else print)
    if args.json:
        print(to_json({"down": True}))
    return 0


def _status(args: argparse.Namespace) -> int:
    status = stack_status(_cfg(args))
    if args.json:
        print(to_json(status))
    else:
        for name, s in status.items():
            print(f"{name:<12} {'running (pid ' + str(s['pid']) + ')' if s['running'] else 'stopped'}")
    return 0 if any(s["running"] for s in status.values()) else 1


def _env(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    env, command = stack_env(cfg), _worker_command(cfg)
    running = any(s["running"] for s in stack_status(cfg).values())
    if args.json:
        print(to_json({"env": env, "worker_command": command, "state_dir": str(cfg.state_dir), "running": running}))
    else:
        print("\n".join(env_lines(env, command)))
    if not running:
        print("cairn dev env: the stack is not running (`cairn dev up` starts it)", file=sys.stderr)
    return 0


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    dev = sub.add_parser("dev", help="the local stack: Temporal + Web UI, SeaweedFS, service, worker")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    for name, fn, help_text in (
        (
            "up",
            _up,
            "start the stack in the background and wait until its worker polls; with the stack up, "
            "start nothing and say so (a part that died is started again, and named)",
        ),
        ("down", _down, "stop what up started"),
        ("status", _status, "show what is running"),
        (
            "env",
            _env,
            "print the environment a worker started by hand needs (export lines, and its command; "
            '`eval "$(cairn dev env)"`)',
        ),
    ):
        p = dev_sub.add_parser(name, help=help_text, description=help_text)
        common(p)
        p.add_argument(
            "--state-dir",
            default=None,
            help=f"data, logs, pid files (default ${STATE_DIR_ENV}, else $XDG_STATE_HOME/cairn, else "
            "~/.local/state/cairn)",
        )
        p.add_argument("--temporal-port", type=int, default=7233)
        p.add_argument("--ui-port", type=int, default=8233)
        p.add_argument("--s3-port", type=int, default=8333)
        p.add_argument("--service-port", type=int, default=8377)
        p.add_argument("--no-worker", action="store_true", help="do not start a worker")
        if name == "up":
            p.add_argument(
                "--config",
                metavar="FILE",
                help="the trainer your runs use (a trainer config, or a run file: its config): the worker "
                "preloads its package, and runs one activity at a time for a torch trainer (the PyTorch "
                "adapter, the Hugging Face trainer), as the README advises",
            )
        p.set_defaults(handler=fn)
