"""Deployment artefacts: the systemd unit, the kustomize base and the Dockerfile.

Real tools where they work offline: `systemd-analyze verify` for the unit, `kustomize build` (or `kubectl
kustomize`) to render the base, and kubernetes-validate (JSON schemas of the Kubernetes API, shipped in the
PyPI package) for every built-in resource. Structural checks for the rest (Prometheus Operator resources,
the Dockerfile, which needs a Docker engine to build).
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdcd.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "cdcd.service"
KUSTOMIZE_DIR = ROOT / "deploy" / "kubernetes"
RULES = ROOT / "deploy" / "prometheus" / "cdcd-rules.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
KUBERNETES_VERSION = "1.30.0"  # the oldest API version the manifests must fit


# --- systemd ---------------------------------------------------------------------------------------------


def _unit_directives() -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        directives.setdefault(key, []).append(value)
    return directives


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: install Debian's package systemd"
    # verify checks that ExecStart's binary exists: point the copy at a stand-in executable.
    stub = tmp_path / "bin" / "cdcd"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "cdcd.service"
    unit.write_text(unit_text.replace("/usr/local/bin/cdcd", str(stub)))
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_systemd_unit_verifies_cleanly(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(), tmp_path)
    # systemd-analyze exits 0 for directives it ignores (typos, bad values): any output is a failure too.
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not output.strip(), output


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Type=notify", "Type=notfy"),  # a bad value: ignored with a warning, exit 0
        ("ProtectSystem=strict", "ProtectSytem=strict"),  # an unknown key: ignored with a warning, exit 0
        ("[Service]", "[Servce]"),  # no ExecStart: exit 1
    ],
)
def test_systemd_verify_catches_a_broken_unit(tmp_path: Path, old: str, new: str) -> None:
    text = UNIT.read_text()
    assert old in text
    result = _verify(text.replace(old, new), tmp_path)
    assert result.returncode != 0 or (result.stdout + result.stderr).strip()


def test_systemd_unit_settings() -> None:
    d = _unit_directives()
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "60",
        "EnvironmentFile": "-/etc/cdcd/cdcd.env",
        "User": "cdcd",
        "StateDirectory": "cdcd",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2",
        "KillSignal": "SIGTERM",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "MemoryDenyWriteExecute": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter": "@system-service",
    }
    assert {key: d.get(key, [None])[-1] for key in expected} == expected
    assert shlex.split(d["ExecStart"][0]) == ["/usr/local/bin/cdcd", "run", "--config", "/etc/cdcd/cdcd.yaml"]
    assert "/var/lib/cdcd" in d["ReadWritePaths"][0].split()
    # The graceful stop (sink.flush_timeout_s, 30 s by default) must fit in TimeoutStopSec.
    assert int(d["TimeoutStopSec"][0]) > 30


# --- Kubernetes --------------------------------------------------------------------------------------------


def _kustomize_command() -> list[str]:
    for candidate in (os.environ.get("KUSTOMIZE"), str(Path(sys.executable).parent / "kustomize")):
        if candidate and os.access(candidate, os.X_OK):
            return [candidate, "build"]
    if path := shutil.which("kustomize"):
        return [path, "build"]
    if path := shutil.which("kubectl"):
        return [path, "kustomize"]
    pytest.fail("neither kustomize nor kubectl found: `go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0`")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    result = subprocess.run(
        [*_kustomize_command(), str(KUSTOMIZE_DIR)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _kubernetes_validate() -> Any:
    """The dev dependency kubernetes-validate (untyped; a missing one fails the tests that use it)."""
    try:
        return importlib.import_module("kubernetes_validate")
    except ImportError:
        pytest.fail("kubernetes-validate is missing: it is a dev dependency (make venv installs it)")


def _one(resources: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_kustomization_lists_existing_files() -> None:
    kustomization = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert all((KUSTOMIZE_DIR / name).is_file() for name in listed)
    manifests = {p.name for p in KUSTOMIZE_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert manifests == listed, "a manifest in deploy/kubernetes is not in kustomization.yaml (or the reverse)"


def test_rendered_kinds(rendered: list[dict[str, Any]]) -> None:
    assert sorted(r["kind"] for r in rendered) == sorted(
        ["ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "Service", "ServiceMonitor", "PrometheusRule"]
    )


def test_builtin_resources_match_the_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kubernetes_validate = _kubernetes_validate()

    builtin = [r for r in rendered if r["apiVersion"] in ("v1", "apps/v1")]
    assert len(builtin) == 5
    for resource in builtin:
        # strict: unknown fields (typos) are errors too.
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_schema_validation_catches_mistakes(rendered: list[dict[str, Any]]) -> None:
    kubernetes_validate = _kubernetes_validate()

    deployment = yaml.safe_load(yaml.safe_dump(_one(rendered, "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = "metrics"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_deployment(rendered: list[dict[str, Any]]) -> None:
    deployment = _one(rendered, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}  # one consumer per slot, even during a rollout
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["args"] == ["run", "--config", "/etc/cdcd/cdcd.yaml"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9187}
    probes = {name: container[name]["httpGet"] for name in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert {name: (p["path"], p["port"]) for name, p in probes.items()} == {
        "livenessProbe": ("/healthz", "metrics"),
        "readinessProbe": ("/readyz", "metrics"),
        "startupProbe": ("/healthz", "metrics"),
    }
    (dsn,) = [e for e in container["env"] if e["name"] == "CDCD_SOURCE__DSN"]
    secret = _one(rendered, "Secret")
    assert dsn["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "dsn"}
    assert "dsn" in secret["stringData"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts.values()) == set(volumes)
    config_map = _one(rendered, "ConfigMap")
    assert volumes[mounts["/etc/cdcd"]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert "emptyDir" in volumes[mounts["/var/lib/cdcd"]] or "persistentVolumeClaim" in volumes[mounts["/var/lib/cdcd"]]
    claim = _one(rendered, "PersistentVolumeClaim")
    assert volumes[mounts["/var/lib/cdcd/state"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert container["image"] == "cdcd:0.1.0"
    resources = container["resources"]
    assert set(resources) == {"requests", "limits"}
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_config_map_is_a_valid_cdcd_config(
    rendered: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("CDCD_"):
            monkeypatch.delenv(name)
    config_file = tmp_path / "cdcd.yaml"
    config_file.write_text(_one(rendered, "ConfigMap")["data"]["cdcd.yaml"])
    monkeypatch.setenv("CDCD_SOURCE__DSN", "host=db dbname=app user=cdcd password=secret")
    settings = load_settings(config_file)
    assert settings.metrics.address == ("0.0.0.0", 9187)
    assert settings.log.format == "json"
    assert settings.sink.run_kind() == "kafka"  # `cdcd run` refuses a configuration without sink.kind
    assert str(settings.buffer.spill_dir).startswith("/var/lib/cdcd/")
    assert settings.snapshot.state_dir == Path("/var/lib/cdcd/state")  # the PersistentVolumeClaim
    deployment = _one(rendered, "Deployment")
    assert settings.sink.flush_timeout_s < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_service_and_service_monitor(rendered: list[dict[str, Any]]) -> None:
    deployment = _one(rendered, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _one(rendered, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9187, "metrics")
    monitor = _one(rendered, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # The alerting rules look at up{job="cdcd"}: the job label comes from the Service's label named here.
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "cdcd"


def test_prometheus_rule_carries_the_rules_file(rendered: list[dict[str, Any]]) -> None:
    rule = _one(rendered, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]
    assert groups
    assert all(group["rules"] for group in groups)
    if not RULES.exists():
        pytest.skip(f"{RULES.relative_to(ROOT)} does not exist yet: nothing to compare the PrometheusRule with")
    assert groups == yaml.safe_load(RULES.read_text())["groups"], (
        "deploy/kubernetes/prometheusrule.yaml is out of date: run .venv/bin/python deploy/kubernetes/sync_rules.py"
    )


# --- Dockerfile --------------------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    logical = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in logical.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            current = []
            stages[rest.split()[-1]] = current  # FROM image AS name
        current.append((keyword, rest))
    return stages


def test_dockerfile_stages() -> None:
    stages = _stages()
    assert list(stages) == ["builder", "runtime"]
    arg = dict(rest.split("=", 1) for keyword, rest in _instructions() if keyword == "ARG")
    assert arg["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(stage[0][1].startswith("${PYTHON_IMAGE} AS") for stage in stages.values())


def test_dockerfile_runtime_stage() -> None:
    runtime = _stages()["runtime"]
    last: dict[str, str] = {keyword: rest for keyword, rest in runtime}
    user = last["USER"].split(":")[0]
    assert user not in ("root", "0")
    assert user == "10001"
    assert "--uid 10001" in last["RUN"]
    assert yaml.safe_load(last["ENTRYPOINT"]) == ["cdcd"]
    assert yaml.safe_load(last["CMD"]) == ["run", "--config", "/etc/cdcd/cdcd.yaml"]
    assert last["EXPOSE"] == "9187"
    assert "/var/lib/cdcd/spill" in last["RUN"]
    # Only runtime dependencies: the wheels built from `pip wheel .`, never the dev extra or the source tree.
    builder_runs = " ".join(rest for keyword, rest in _stages()["builder"] if keyword == "RUN")
    assert "pip wheel" in builder_runs
    everything = " ".join(rest for _, rest in _instructions())
    assert "[dev" not in everything
    assert "pip install --no-index --find-links /wheels cdcd" in last["RUN"]
    runtime_copies = [rest for keyword, rest in runtime if keyword == "COPY"]
    assert runtime_copies == ["config/cdcd.example.yaml /etc/cdcd/cdcd.yaml"]


def test_dockerignore_admits_what_the_dockerfile_copies() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"]
    assert patterns[0] == "*"  # an allowlist: .venv, .git, tests and caches never reach the context
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied: set[str] = set()
    for keyword, rest in _instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            copied.update(rest.split()[:-1])
    assert copied <= allowed, f"copied but excluded by .dockerignore: {copied - allowed}"
    assert all((ROOT / path).exists() for path in copied)
    # The wheel build needs the readme pyproject.toml names.
    assert "README.md" in copied
