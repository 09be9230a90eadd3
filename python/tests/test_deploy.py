"""The deployment files in deploy/ are valid: the Kubernetes manifests against
the Kubernetes API schema (kubernetes-validate, strict: unknown fields fail),
the systemd unit with systemd-analyze, the Dockerfile's shape, and every kvtier
config they carry with the real binary (unknown keys are refused)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(__import__("sys").executable).parent))
    if not found:
        pytest.fail(f"{name} is not installed (scripts/setup.sh --test installs it)")
    return found


def _check_config(kvtier_bin, toml_text: str, tmp_path: Path) -> str:
    p = tmp_path / "kvtier.toml"
    p.write_text(toml_text)
    r = subprocess.run([str(kvtier_bin), "serve", "--config", str(p), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"kvtier refuses the config:\n{r.stderr}"
    return r.stdout


def test_kubernetes_manifests_validate_against_the_api_schema():
    r = subprocess.run([_tool("kubernetes-validate"), "--strict", "--quiet", "--no-warn",
                        str(DEPLOY / "kubernetes" / "kvtier.yaml")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_manifests_hang_together(kvtier_bin, tmp_path):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "kvtier.yaml").read_text())}
    sts = docs[("StatefulSet", "kvtier")]
    headless = docs[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None", "a StatefulSet's serviceName must be a headless Service"
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in (d for (k, _), d in docs.items() if k == "Service"):
        assert svc["spec"]["selector"].items() <= labels.items()
    c = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz" and c[probe]["httpGet"]["port"] in ports
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["http"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The ConfigMap's config is one kvtier accepts, listening where the pod's ports say.
    cm = docs[("ConfigMap", "kvtier")]
    effective = _check_config(kvtier_bin, cm["data"]["kvtier.toml"], tmp_path)
    assert f":{ports['grpc']}" in effective and f":{ports['http']}" in effective
    assert ports["data"] == ports["grpc"] + 1, "data_listen = auto is the gRPC port + 1"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert 'dir = "' + mounts["data"] in effective, "the disk tier lives on the volume"
    # Authentication on, its tokens from the Secret's volume (docs/security.md).
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tokens"]["secret"]["secretName"] == "kvtier-tokens"
    assert f'tokens_file = "{mounts["tokens"]}/tokens.toml"' in effective


def test_systemd_unit_verifies(kvtier_bin, tmp_path):
    unit = (DEPLOY / "systemd" / "kvtier.service").read_text()
    assert "ExecStart=/usr/local/bin/kvtier serve --config /etc/kvtier/kvtier.toml" in unit
    local = tmp_path / "kvtier.service"
    local.write_text(unit.replace("/usr/local/bin/kvtier", str(kvtier_bin)))
    r = subprocess.run([_tool("systemd-analyze"), "verify", str(local)], capture_output=True, text=True, timeout=120)
    # systemd-analyze exits 0 on many problems it only warns about: any output is a failure.
    problems = [line for line in (r.stdout + r.stderr).splitlines() if str(local) in line or "kvtier" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck(kvtier_bin, tmp_path):
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert len(froms) >= 2 and " AS build" in froms[0], "multi-stage: build, then a slim runtime"
    final = text.split(froms[-1], 1)[1]
    user = re.search(r"^USER (\S+)", final, re.M)
    assert user and user.group(1).split(":")[0] not in ("0", "root"), "the runtime image runs as non-root"
    assert re.search(r"^HEALTHCHECK .*CMD", final, re.M | re.S)
    assert "COPY --from=build" in final and "cargo" not in final
    exposed = {int(p) for line in lines if line.startswith("EXPOSE") for p in line.split()[1:]}
    effective = _check_config(kvtier_bin, (DEPLOY / "kvtier.container.toml").read_text(), tmp_path)
    assert exposed == {50051, 50052, 8080}
    assert "0.0.0.0:50051" in effective and "0.0.0.0:8080" in effective
    assert 'tokens_file = "/etc/kvtier/tokens.toml"' in effective, "beyond loopback only with tokens"
    assert '"health"' in text, "the health check needs no token"
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {"target", ".tools", ".venv"} <= set(ignored), "the build context leaves out build outputs"
