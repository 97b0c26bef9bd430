"""The deploy files (``deploy/``), parsed and cross-checked offline: no Docker, no cluster.

Each check is a function from an in-memory document to the problems it finds. The real files
must have none; each negative case edits an in-memory copy and shows that the check catches it
(nothing is written anywhere).

The grace-period floor is derived, not copied: the worker's ``graceful_shutdown_timeout`` (read
from ``workers/worker.py``) plus ``SAVE_MARGIN_S`` for the step and checkpoint save that may still
be under way when it expires.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO
from workers.metrics import DEFAULT_METRICS_PORT

DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
K8S_DIR = DEPLOY / "k8s"
SYSTEMD_UNIT = DEPLOY / "systemd" / "cairn-worker.service"
SYSTEMD_ENV = DEPLOY / "systemd" / "worker.env.example"

K8S_VERSION = "1.30.0"
"""Kubernetes schemas the manifests are validated against, offline: kubernetes-validate ships them
from the floor pyproject.toml sets (>=1.30) on (1.37 still ships 1.25 to 1.37)."""

SAVE_MARGIN_S = 30
"""Time a shutdown may need past the SDK's graceful timeout: the step and save under way."""

WORKER_SETTINGS = frozenset(
    {
        "TEMPORAL_ADDRESS",
        "TEMPORAL_NAMESPACE",
        "AWS_ENDPOINT_URL_S3",
        "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "CAIRN_LOG_FORMAT",
        "CAIRN_METRICS_PORT",
    }
)
"""What every worker deployment (compose, Kubernetes, systemd) must set."""

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def graceful_shutdown_s() -> int:
    source = (REPO / "workers" / "worker.py").read_text()
    found = re.findall(r"graceful_shutdown_timeout=timedelta\(seconds=(\d+)\)", source)
    assert len(found) == 1, "workers/worker.py: graceful_shutdown_timeout=timedelta(seconds=N) not found once"
    return int(found[0])


GRACE_FLOOR_S = graceful_shutdown_s() + SAVE_MARGIN_S


BUILD_COMMAND = re.compile(r"docker build -f deploy/Dockerfile -t (\S+) \.")


def documented_image() -> str:
    """The image tag the build command in deploy/README.md gives, which must be the package's version."""
    tags: set[str] = set(BUILD_COMMAND.findall((DEPLOY / "README.md").read_text()))
    assert len(tags) == 1, f"deploy/README.md should document one build command with one tag, found {sorted(tags)}"
    return tags.pop()


IMAGE = documented_image()


# --------------------------------------------------------------------------------------------
# Parsers for the formats involved (small, for exactly what these files use)


def go_duration_s(text: str | int | float) -> float:
    """A compose duration ('120s', '1m30s', '2m') in seconds."""
    if isinstance(text, int | float):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * unit[u] for n, u in parts)


def systemd_timespan_s(text: str) -> float:
    """A systemd time span ('120', '2min', '1min 30s', 'infinity') in seconds."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    if re.fullmatch(r"\d+", text):
        return float(text)
    unit = {"ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    parts = re.findall(r"(\d+)\s*(ms|sec|s|min|m|hr|h)\b", text)
    if not parts:
        raise ValueError(f"not a time span: {text!r}")
    return sum(int(n) * unit[u] for n, u in parts)


def image_tag(ref: str) -> str | None:
    """The tag of an image reference, or None; a digest (@sha256:...) counts as a tag."""
    if "@" in ref:
        return ref.split("@", 1)[1]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def instruction_argv(args: str) -> list[str]:
    """Exec form (JSON array) or shell form, as a list of words."""
    if args.startswith("["):
        value = json.loads(args)
        assert isinstance(value, list)
        return [str(v) for v in value]
    return shlex.split(args)


def systemd_sections(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value assigned (a unit may repeat a key)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a unit file line: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def env_file_keys(text: str) -> set[str]:
    keys = set()
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, _ = line.partition("=")
            assert sep, f"not KEY=VALUE: {raw!r}"
            keys.add(key.strip())
    return keys


def inside_repo(path: Path) -> bool:
    return path.resolve().is_relative_to(REPO)


# --------------------------------------------------------------------------------------------
# (a) docker-compose.yml


def compose_doc() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(doc, dict)
    return doc


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _volume(volume: str | dict[str, Any]) -> tuple[str, str | None]:
    """('bind' | 'volume' | 'anonymous', source) of a service's volume, short or long syntax."""
    if isinstance(volume, dict):
        return volume.get("type", "volume"), volume.get("source")
    if ":" not in volume:
        return "anonymous", None
    source = volume.split(":", 1)[0]
    return ("bind" if source.startswith((".", "/", "~")) else "volume"), source


def _env_files(service: dict[str, Any]) -> list[str]:
    return [e["path"] if isinstance(e, dict) else e for e in _as_list(service.get("env_file"))]


def _compose_paths(service: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """(what, path as written) for every host path a service names, relative to deploy/."""
    for written in _env_files(service):
        yield "env_file", written
    for volume in _as_list(service.get("volumes")):
        kind, source = _volume(volume)
        if kind == "bind" and source is not None:
            yield "bind mount", source


def _runs_cairn_worker(service: dict[str, Any]) -> bool:
    """Built from our Dockerfile and keeping its entrypoint (`cairn worker`)."""
    return "build" in service and "entrypoint" not in service


def _env_keys(environment: dict[str, Any] | list[str] | None) -> set[str]:
    """The variable names of a compose `environment:` (mapping or list of KEY=VALUE)."""
    if isinstance(environment, list):
        return {item.split("=", 1)[0] for item in environment}
    return set(environment or {})


def _image_problems(name: str, service: dict[str, Any]) -> list[str]:
    build, image = service.get("build"), service.get("image")
    if build is None:
        if not image:
            return [f"{name}: neither image nor build"]
        if image_tag(image) in (None, "latest"):
            return [f"{name}: image {image!r} has no explicit tag (or is 'latest')"]
        return []
    problems = []
    build = {"context": build} if isinstance(build, str) else build
    context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
    if context != REPO:
        problems.append(f"{name}: build.context {build.get('context')!r} is not the repository root")
    if (context / build.get("dockerfile", "Dockerfile")).resolve() != DOCKERFILE.resolve():
        problems.append(f"{name}: build.dockerfile {build.get('dockerfile')!r} is not deploy/Dockerfile")
    if image is not None and image != IMAGE:
        problems.append(f"{name}: built image tagged {image!r}, the documented tag is {IMAGE!r}")
    return problems


def _reference_problems(name: str, service: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """Host paths, named volumes and dependencies that must exist."""
    problems = []
    for what, written in _compose_paths(service):
        path = COMPOSE_FILE.parent / written
        if not inside_repo(path):
            problems.append(f"{name}: {what} {written!r} is outside the repository")
        elif not path.exists():
            problems.append(f"{name}: {what} {written!r} does not exist")
    for volume in _as_list(service.get("volumes")):
        kind, source = _volume(volume)
        if kind == "volume" and source not in (doc.get("volumes") or {}):
            problems.append(f"{name}: volume {source!r} is not declared under top-level volumes")
    services = doc["services"]
    depends = service.get("depends_on") or {}
    for dep, spec in depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends):
        if dep not in services:
            problems.append(f"{name}: depends_on unknown service {dep!r}")
        elif (spec or {}).get("condition") == "service_healthy" and "healthcheck" not in services[dep]:
            problems.append(f"{name}: waits for {dep!r} to be healthy, but {dep!r} has no healthcheck")
    return problems


def _worker_problems(name: str, service: dict[str, Any]) -> list[str]:
    problems = []
    grace = go_duration_s(service.get("stop_grace_period", "10s"))  # compose's default is 10 s
    if grace < GRACE_FLOOR_S:
        problems.append(f"{name}: stop_grace_period {grace:g} s < {GRACE_FLOOR_S} s")
    if service.get("stop_signal", "SIGTERM") != "SIGTERM":
        problems.append(f"{name}: stop_signal {service['stop_signal']!r}, the worker checkpoints on SIGTERM")
    keys = _env_keys(service.get("environment"))
    for written in _env_files(service):
        path = COMPOSE_FILE.parent / written
        if path.is_file() and inside_repo(path):
            keys |= env_file_keys(path.read_text())
    if missing := sorted(WORKER_SETTINGS - keys):
        problems.append(f"{name}: worker settings not set: {missing}")
    return problems


def compose_problems(doc: dict[str, Any]) -> list[str]:
    services: dict[str, Any] = doc.get("services") or {}
    if not services:
        return ["no services"]
    problems = []
    for name, service in services.items():
        problems += _image_problems(name, service) + _reference_problems(name, service, doc)
    workers = {name: s for name, s in services.items() if _runs_cairn_worker(s)}
    if not workers:
        problems.append("no service runs `cairn worker` (built from deploy/Dockerfile, entrypoint kept)")
    for name, service in workers.items():
        problems += _worker_problems(name, service)
    return problems


def test_compose_file_is_consistent() -> None:
    assert compose_problems(compose_doc()) == []


def test_compose_runs_two_workers_and_the_stack() -> None:
    services = compose_doc()["services"]
    assert services["worker"]["deploy"]["replicas"] == 2
    assert {"postgresql", "temporal", "temporal-ui", "minio", "minio-init", "reservations"} <= set(services)
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    ui_env = services["temporal-ui"]["environment"]
    assert ui_env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert ui_env["TEMPORAL_START_WORKFLOW_DISABLED"] == "false"


def cases(breaks: list[tuple[str, Any, str]]) -> list[Any]:
    """(name, edit, expected problem) rows as pytest params named for the break."""
    return [pytest.param(edit, expected, id=name) for name, edit, expected in breaks]


def _svc(name: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda doc: edit(doc["services"][name])


COMPOSE_BREAKS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("untagged image", _svc("postgresql", lambda s: s.update(image="postgres")), "no explicit tag"),
    ("latest image", _svc("minio", lambda s: s.update(image="minio/minio:latest")), "no explicit tag"),
    ("no image nor build", _svc("minio", lambda s: s.pop("image")), "neither image nor build"),
    ("wrong context", _svc("worker", lambda s: s.update(build={"context": ".", "dockerfile": "Dockerfile"})),
     "build.context"),
    ("wrong dockerfile", _svc("worker", lambda s: s.update(build={"context": "..", "dockerfile": "x/Dockerfile"})),
     "build.dockerfile"),
    ("other tag", _svc("worker", lambda s: s.update(image="cairn-worker:9.9.9")), "documented tag"),
    ("missing env_file", _svc("worker", lambda s: s.update(env_file=["compose/nope.env"])), "does not exist"),
    ("missing bind mount", _svc("temporal", lambda s: s.update(volumes=["./dynamicconfig:/etc/dc"])),
     "does not exist"),
    ("bind mount outside", _svc("temporal", lambda s: s.update(volumes=["/etc:/etc/host"])), "outside"),
    ("undeclared volume", _svc("minio", lambda s: s.update(volumes=["elsewhere:/data"])), "not declared"),
    ("short grace", _svc("worker", lambda s: s.update(stop_grace_period="20s")), "stop_grace_period"),
    ("default grace", _svc("worker", lambda s: s.pop("stop_grace_period")), "stop_grace_period"),
    ("SIGKILL first", _svc("worker", lambda s: s.update(stop_signal="SIGKILL")), "stop_signal"),
    ("no worker", _svc("worker", lambda s: s.update(entrypoint=["sleep"])), "no service runs"),
    ("unhealthy dependency", _svc("temporal", lambda s: s.pop("healthcheck")), "has no healthcheck"),
    ("unknown dependency", _svc("worker", lambda s: s["depends_on"].update(nope={"condition": "service_started"})),
     "unknown service"),
    ("missing setting", _svc("worker", lambda s: s.update(env_file=[], environment={})), "worker settings not set"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "expected"), cases(COMPOSE_BREAKS))
def test_compose_check_catches(edit: Callable[[dict[str, Any]], None], expected: str) -> None:
    doc = copy.deepcopy(compose_doc())
    edit(doc)
    assert any(expected in p for p in compose_problems(doc)), compose_problems(doc)


@pytest.mark.parametrize(("text", "seconds"), [("120s", 120), ("1m30s", 90), ("2m", 120), ("500ms", 0.5), (45, 45)])
def test_go_duration(text: str | int, seconds: float) -> None:
    assert go_duration_s(text) == seconds


# --------------------------------------------------------------------------------------------
# (b) Kubernetes manifests


Docs = list[tuple[str, dict[str, Any]]]
"""(file name, resource) for every resource under deploy/k8s/."""


def k8s_docs() -> Docs:
    docs = []
    for path in sorted(K8S_DIR.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def _by_kind(docs: Docs, kind: str) -> list[dict[str, Any]]:
    return [d for _, d in docs if d.get("kind") == kind]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    match = selector.get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items()) and not selector.get("matchExpressions")


def schema_problems(docs: Docs) -> list[str]:
    problems = []
    for filename, doc in docs:
        what = f"{filename}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{what}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{what}: {exc.message}")
    return problems


def _container_env_names(container: dict[str, Any], docs: Docs) -> set[str]:
    names = {e["name"] for e in container.get("env") or []}
    for source in container.get("envFrom") or []:
        for ref_key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            ref = source.get(ref_key)
            for obj in _by_kind(docs, kind) if ref else []:
                if obj["metadata"]["name"] == ref["name"]:
                    names |= set(obj.get("data") or {}) | set(obj.get("stringData") or {})
    return names


def _pod_problems(pod: dict[str, Any], worker: dict[str, Any], docs: Docs) -> list[str]:
    """Shutdown budget, user, image and where the worker's environment comes from."""
    problems = []
    grace = pod.get("terminationGracePeriodSeconds", 30)  # Kubernetes' default is 30 s
    if grace < GRACE_FLOOR_S:
        problems.append(f"Deployment: terminationGracePeriodSeconds {grace} < {GRACE_FLOOR_S}")
    if not (pod.get("securityContext") or {}).get("runAsNonRoot"):
        problems.append("Deployment: pod securityContext.runAsNonRoot is not true")
    if worker.get("image") != IMAGE:
        problems.append(f"Deployment: image {worker.get('image')!r}, the documented tag is {IMAGE!r}")
    names = {(d.get("kind"), (d.get("metadata") or {}).get("name")) for _, d in docs}
    for source in worker.get("envFrom") or []:
        for ref_key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            ref = source.get(ref_key)
            if ref and not ref.get("optional") and (kind, ref["name"]) not in names:
                problems.append(f"Deployment: envFrom {ref_key} {ref['name']!r} is not among the manifests")
    env = _container_env_names(worker, docs)
    if missing := sorted(WORKER_SETTINGS - env):
        problems.append(f"Deployment: worker settings not set: {missing}")
    for arg in [*worker.get("command", []), *worker.get("args", [])]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            if var not in env:
                problems.append(f"Deployment: argument references $({var}), which no env source defines")
    return problems


def _metrics_problems(template: dict[str, Any], worker: dict[str, Any], docs: Docs) -> list[str]:
    """One metrics port: the containerPort, the scrape annotations, the probe, CAIRN_METRICS_PORT."""
    problems = []
    port = str(DEFAULT_METRICS_PORT)
    ports = {p.get("name"): p["containerPort"] for p in worker.get("ports") or []}
    if ports.get("metrics") != DEFAULT_METRICS_PORT:
        problems.append(f"Deployment: no containerPort {port} named 'metrics'")
    annotations = template["metadata"].get("annotations") or {}
    if (annotations.get("prometheus.io/scrape"), annotations.get("prometheus.io/port")) != ("true", port):
        problems.append("Deployment: prometheus.io/scrape and prometheus.io/port do not point at the metrics port")
    probe = (worker.get("readinessProbe") or {}).get("tcpSocket", {}).get("port")
    if probe not in ("metrics", DEFAULT_METRICS_PORT):
        problems.append("Deployment: readinessProbe is not a TCP probe of the metrics port")
    for config in _by_kind(docs, "ConfigMap"):
        configured = (config.get("data") or {}).get("CAIRN_METRICS_PORT")
        if configured not in (None, port):
            problems.append(f"ConfigMap: CAIRN_METRICS_PORT {configured} is not the metrics containerPort")
    return problems


def _selector_problems(spec: dict[str, Any], docs: Docs) -> list[str]:
    """The Deployment, its PodDisruptionBudget and Services all select the worker pods."""
    problems = []
    pod_labels = spec["template"]["metadata"].get("labels") or {}
    if not _selects(spec["selector"], pod_labels):
        problems.append("Deployment: its selector does not match its pod labels")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    if not pdbs:
        problems.append("no PodDisruptionBudget")
    for pdb in pdbs:
        if not _selects(pdb["spec"].get("selector") or {}, pod_labels):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']}: selector does not match the worker pods")
    for service in _by_kind(docs, "Service"):
        if not _selects({"matchLabels": service["spec"].get("selector") or {}}, pod_labels):
            problems.append(f"Service {service['metadata']['name']}: selector does not match the worker pods")
    return problems


def manifest_problems(docs: Docs) -> list[str]:
    """Cross-checks the schemas cannot make (run on schema-valid resources)."""
    deployments = _by_kind(docs, "Deployment")
    if len(deployments) != 1:
        return [f"expected one Deployment, found {len(deployments)}"]
    spec = deployments[0]["spec"]
    pod = spec["template"]["spec"]
    worker = next((c for c in pod["containers"] if c["name"] == "worker"), None)
    if worker is None:
        return ["Deployment: no container named 'worker'"]
    return (
        _pod_problems(pod, worker, docs)
        + _metrics_problems(spec["template"], worker, docs)
        + _selector_problems(spec, docs)
    )


def test_manifests_validate_against_kubernetes_schemas() -> None:
    shipped = {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    assert K8S_VERSION.rsplit(".", 1)[0] in shipped, f"kubernetes-validate ships no schemas for {K8S_VERSION}"
    docs = k8s_docs()
    assert {d["kind"] for _, d in docs} >= {"Deployment", "ConfigMap", "Secret", "PodDisruptionBudget"}
    assert schema_problems(docs) == []


def test_manifests_are_consistent() -> None:
    assert manifest_problems(k8s_docs()) == []


def test_secret_holds_placeholders_only() -> None:
    (secret,) = [d for _, d in k8s_docs() if d["kind"] == "Secret"]
    assert set(secret["stringData"].values()) == {"REPLACE-ME"}


def _kind(kind: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[Docs], None]:
    def apply(docs: Docs) -> None:
        for obj in _by_kind(docs, kind):
            edit(obj)

    return apply


def _pod(edit: Callable[[dict[str, Any]], None]) -> Callable[[Docs], None]:
    return _kind("Deployment", lambda d: edit(d["spec"]["template"]["spec"]))


def _worker(edit: Callable[[dict[str, Any]], None]) -> Callable[[Docs], None]:
    return _pod(lambda p: edit(p["containers"][0]))


SCHEMA_BREAKS: list[tuple[str, Callable[[Docs], None], str]] = [
    ("misspelt field", _pod(lambda p: p.update(terminationGracePeriod=120)), "terminationGracePeriod"),
    ("wrong type", _pod(lambda p: p.update(terminationGracePeriodSeconds="120")), "terminationGracePeriodSeconds"),
    ("unknown kind", lambda docs: docs.append(("x.yaml", {"apiVersion": "v1", "kind": "Gadget", "metadata": {}})),
     "Couldn't find schema"),
    ("bad port", _worker(lambda c: c["ports"][0].update(containerPort="metrics")), "containerPort"),
]  # fmt: skip

MANIFEST_BREAKS: list[tuple[str, Callable[[Docs], None], str]] = [
    ("other image", _worker(lambda c: c.update(image="cairn-worker:latest")), "documented tag"),
    ("short grace", _pod(lambda p: p.update(terminationGracePeriodSeconds=30)), "terminationGracePeriodSeconds"),
    ("default grace", _pod(lambda p: p.pop("terminationGracePeriodSeconds")), "terminationGracePeriodSeconds"),
    ("root", _pod(lambda p: p["securityContext"].pop("runAsNonRoot")), "runAsNonRoot"),
    ("unknown ConfigMap", _worker(lambda c: c["envFrom"][0]["configMapRef"].update(name="nope")), "'nope'"),
    ("unknown Secret", _worker(lambda c: c["envFrom"][1]["secretRef"].update(name="nope")), "'nope'"),
    ("setting dropped", _kind("ConfigMap", lambda m: m["data"].pop("TEMPORAL_ADDRESS")), "TEMPORAL_ADDRESS"),
    ("undefined $(VAR)", _worker(lambda c: c.update(args=["--task-queue", "$(NOPE)"])), "$(NOPE)"),
    ("PDB misses pods", _kind("PodDisruptionBudget", lambda b: b["spec"].update(selector={"matchLabels": {"a": "b"}})),
     "PodDisruptionBudget"),
    ("Service misses pods", _kind("Service", lambda s: s["spec"].update(selector={"app": "other"})), "Service"),
    ("selector misses pods", _kind("Deployment", lambda d: d["spec"]["template"]["metadata"].update(labels={"x": "y"})),
     "its selector"),
    ("no metrics port", _worker(lambda c: c["ports"][0].update(name="http")), "named 'metrics'"),
    ("annotation port", _kind("Deployment", lambda d: d["spec"]["template"]["metadata"]["annotations"].update(
        {"prometheus.io/port": "8000"})), "prometheus.io"),
    ("ConfigMap port", _kind("ConfigMap", lambda m: m["data"].update(CAIRN_METRICS_PORT="8000")), "CAIRN_METRICS_PORT"),
    ("probe elsewhere", _worker(lambda c: c["readinessProbe"]["tcpSocket"].update(port=8000)), "readinessProbe"),
    ("no PDB", lambda docs: docs.__setitem__(slice(None), [d for d in docs if d[1]["kind"] != "PodDisruptionBudget"]),
     "no PodDisruptionBudget"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "expected"), cases(SCHEMA_BREAKS))
def test_schema_check_catches(edit: Callable[[Docs], None], expected: str) -> None:
    docs = copy.deepcopy(k8s_docs())
    edit(docs)
    problems = schema_problems(docs)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("edit", "expected"), cases(MANIFEST_BREAKS))
def test_manifest_check_catches(edit: Callable[[Docs], None], expected: str) -> None:
    docs = copy.deepcopy(k8s_docs())
    edit(docs)
    problems = manifest_problems(docs)
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------------
# (c) Dockerfile


def _packages_installed() -> set[str]:
    """Top-level packages pyproject.toml's setuptools find includes ('cairn*' -> 'cairn')."""
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.rstrip("*").rstrip(".") for p in patterns}


def _copy_problems(instructions: list[tuple[str, str]]) -> list[str]:
    """COPY sources exist in the context (the repo root) and cover what `pip install .` needs."""
    problems = []
    copied: set[str] = set()
    for word, args in instructions:
        if word not in ("COPY", "ADD"):
            continue
        argv = instruction_argv(args)
        if any(a.startswith("--from=") for a in argv):
            continue  # from another stage, not the context
        *sources, _dest = [a for a in argv if not a.startswith("--")]
        for source in sources:
            path = REPO / source
            if not inside_repo(path) or not path.exists():
                problems.append(f"{word} {source}: not found relative to the repository root")
            copied.add(str(PurePosixPath(source)))
    if missing := sorted(_packages_installed() - copied):
        problems.append(f"packages pyproject.toml installs are not copied: {missing}")
    for needed in ("pyproject.toml", PYPROJECT["project"]["readme"], *PYPROJECT["project"].get("license-files", [])):
        if needed not in copied:
            problems.append(f"{needed} is not copied (pip install . needs it)")
    return problems


def _runtime_problems(instructions: list[tuple[str, str]]) -> list[str]:
    """What the container runs, as whom, how it is stopped, what it exposes."""
    problems = []

    def last(word: str) -> str | None:
        return next((a for w, a in reversed(instructions) if w == word), None)

    for base in (a.split()[0] for w, a in instructions if w == "FROM"):
        if image_tag(base) in (None, "latest"):
            problems.append(f"FROM {base}: no explicit tag")
    entrypoint = last("ENTRYPOINT")
    scripts = PYPROJECT["project"]["scripts"]
    if entrypoint is None:
        problems.append("no ENTRYPOINT")
    elif not entrypoint.startswith("["):
        problems.append("ENTRYPOINT in shell form: the worker would not receive SIGTERM (sh is PID 1)")
    elif (argv := instruction_argv(entrypoint))[:2] != ["cairn", "worker"] or "cairn" not in scripts:
        problems.append(f"ENTRYPOINT {argv}: not the `cairn worker` console script ({sorted(scripts)})")
    if (last("USER") or "root").split(":")[0] in ("root", "0"):
        problems.append("the image runs as root (no USER, or USER root)")
    if last("STOPSIGNAL") not in (None, "SIGTERM"):
        problems.append(f"STOPSIGNAL {last('STOPSIGNAL')}: the worker checkpoints on SIGTERM")
    exposed = {a.split("/")[0] for w, args in instructions if w == "EXPOSE" for a in args.split()}
    if str(DEFAULT_METRICS_PORT) not in exposed:
        problems.append(f"metrics port {DEFAULT_METRICS_PORT} is not EXPOSEd")
    return problems


def dockerfile_problems(text: str) -> list[str]:
    instructions = dockerfile_instructions(text)
    return _copy_problems(instructions) + _runtime_problems(instructions)


def test_dockerfile_is_consistent() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_the_image_tag_is_the_package_version_everywhere() -> None:
    version = PYPROJECT["project"]["version"]
    assert documented_image() == f"cairn-worker:{version}"
    for path in (p for p in DEPLOY.rglob("*") if p.is_file()):
        for tag in BUILD_COMMAND.findall(path.read_text()):
            assert tag == IMAGE, f"{path.relative_to(REPO)}: builds {tag}, deploy/README.md documents {IMAGE}"


def _replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)

    return edit


DOCKERFILE_BREAKS: list[tuple[str, Callable[[str], str], str]] = [
    ("missing source", _replace("COPY workers/ workers/", "COPY workerz/ workers/"), "workerz/"),
    ("package not copied", _replace("COPY activities/ activities/\n", ""), "['activities']"),
    (
        "readme not copied",
        _replace("COPY pyproject.toml README.md LICENSE ./", "COPY pyproject.toml LICENSE ./"),
        "README.md",
    ),  # fmt: skip
    (
        "license not copied",
        _replace("COPY pyproject.toml README.md LICENSE ./", "COPY pyproject.toml README.md ./"),
        "LICENSE",
    ),  # fmt: skip
    ("other entrypoint", _replace('ENTRYPOINT ["cairn", "worker"]', 'ENTRYPOINT ["cairn-worker"]'), "ENTRYPOINT"),
    ("shell entrypoint", _replace('ENTRYPOINT ["cairn", "worker"]', "ENTRYPOINT cairn worker"), "shell form"),
    ("root", _replace("USER 10001:10001", "USER root"), "root"),
    ("latest base", _replace("FROM python:3.11-slim", "FROM python:latest"), "FROM"),
    ("stop signal", _replace("STOPSIGNAL SIGTERM", "STOPSIGNAL SIGKILL"), "STOPSIGNAL"),
    ("no metrics port", _replace("EXPOSE 9464", "EXPOSE 8000"), "EXPOSE"),
]


@pytest.mark.parametrize(("edit", "expected"), cases(DOCKERFILE_BREAKS))
def test_dockerfile_check_catches(edit: Callable[[str], str], expected: str) -> None:
    problems = dockerfile_problems(edit(DOCKERFILE.read_text()))
    assert any(expected in p for p in problems), problems


# --------------------------------------------------------------------------------------------
# (d) systemd unit


def systemd_problems(text: str, env_example: str) -> list[str]:
    problems = []
    service = systemd_sections(text).get("Service", {})

    def last(key: str) -> str | None:
        return service[key][-1] if service.get(key) else None

    timeout = last("TimeoutStopSec") or last("TimeoutSec")
    if timeout is None or systemd_timespan_s(timeout) < GRACE_FLOOR_S:
        problems.append(f"TimeoutStopSec={timeout or '(unset)'}: must be set, >= {GRACE_FLOOR_S} s")
    exec_start = last("ExecStart")
    argv = shlex.split(exec_start.lstrip("-@:+!")) if exec_start else []  # prefixes: systemd.service(5)
    if not argv or [PurePosixPath(argv[0]).name, *argv[1:2]] != ["cairn", "worker"]:
        problems.append(f"ExecStart {exec_start!r} does not run `cairn worker`")
    if last("KillSignal") not in (None, "SIGTERM", "TERM", "15"):
        problems.append(f"KillSignal {last('KillSignal')}: the worker checkpoints on SIGTERM")
    if last("Restart") != "on-failure":
        problems.append(f"Restart={last('Restart')}, expected on-failure (a clean stop stays stopped)")
    if last("User") in (None, "root", "0"):
        problems.append("runs as root (no User=)")
    if not last("EnvironmentFile"):
        problems.append("no EnvironmentFile")
    if missing := sorted(WORKER_SETTINGS - env_file_keys(env_example)):
        problems.append(f"worker.env.example: worker settings not set: {missing}")
    return problems


def test_systemd_unit_is_consistent() -> None:
    assert systemd_problems(SYSTEMD_UNIT.read_text(), SYSTEMD_ENV.read_text()) == []


SYSTEMD_BREAKS: list[tuple[str, Callable[[str], str], str]] = [
    ("short timeout", _replace("TimeoutStopSec=120", "TimeoutStopSec=45s"), "TimeoutStopSec"),
    ("no timeout", _replace("TimeoutStopSec=120\n", ""), "TimeoutStopSec"),
    ("other command", _replace("bin/cairn worker", "bin/python -m http.server"), "ExecStart"),
    ("other subcommand", _replace("bin/cairn worker", "bin/cairn dev up"), "ExecStart"),
    ("kill signal", _replace("KillSignal=SIGTERM", "KillSignal=SIGKILL"), "KillSignal"),
    ("restart always", _replace("Restart=on-failure", "Restart=always"), "Restart"),
    ("root", _replace("User=cairn", "User=root"), "root"),
    ("no env file", _replace("EnvironmentFile=/etc/cairn/worker.env\n", ""), "EnvironmentFile"),
]


@pytest.mark.parametrize(("edit", "expected"), cases(SYSTEMD_BREAKS))
def test_systemd_check_catches(edit: Callable[[str], str], expected: str) -> None:
    problems = systemd_problems(edit(SYSTEMD_UNIT.read_text()), SYSTEMD_ENV.read_text())
    assert any(expected in p for p in problems), problems


def test_systemd_check_catches_a_missing_setting() -> None:
    env = SYSTEMD_ENV.read_text().replace("CAIRN_METRICS_PORT=", "# CAIRN_METRICS_PORT=")
    assert any("CAIRN_METRICS_PORT" in p for p in systemd_problems(SYSTEMD_UNIT.read_text(), env))


@pytest.mark.parametrize(("text", "seconds"), [("120", 120), ("2min", 120), ("1min 30s", 90), ("90sec", 90)])
def test_systemd_timespan(text: str, seconds: float) -> None:
    assert systemd_timespan_s(text) == seconds


# --------------------------------------------------------------------------------------------
# All three


def test_every_deployment_allows_the_same_shutdown() -> None:
    """One budget everywhere: compose, Kubernetes and systemd give a worker the same time."""
    compose = go_duration_s(compose_doc()["services"]["worker"]["stop_grace_period"])
    (deployment,) = [d for _, d in k8s_docs() if d["kind"] == "Deployment"]
    k8s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    systemd = systemd_timespan_s(systemd_sections(SYSTEMD_UNIT.read_text())["Service"]["TimeoutStopSec"][-1])
    assert compose == k8s == systemd >= GRACE_FLOOR_S


# -- multi-host gangs (deploy/k8s-gang) ------------------------------------------------------------
def gang_docs() -> Docs:
    path = DEPLOY / "k8s-gang" / "statefulset.yaml"
    return [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_gang_statefulset_validates_and_each_pod_is_a_named_node() -> None:
    from workers.worker import add_worker_args

    docs = gang_docs()
    assert schema_problems(docs) == []
    (sts,) = _by_kind(docs, "StatefulSet")
    (service,) = _by_kind(docs, "Service")
    pod = sts["spec"]["template"]
    assert _selects(sts["spec"]["selector"], pod["metadata"]["labels"])
    assert _selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    (worker,) = pod["spec"]["containers"]
    assert worker["image"] == IMAGE
    assert pod["spec"]["terminationGracePeriodSeconds"] >= GRACE_FLOOR_S
    env = _container_env_names(worker, gang_docs() + k8s_docs())
    for arg in worker["args"]:
        for var in re.findall(r"\$\((\w+)\)", arg):
            assert var in env, var
    parser = __import__("argparse").ArgumentParser()
    add_worker_args(parser)
    args = parser.parse_args([re.sub(r"\$\((\w+)\)", "x", a) for a in worker["args"]])
    assert args.node == "x" and args.advertise_addr == "x"
