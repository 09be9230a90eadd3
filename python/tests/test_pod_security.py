"""The Kubernetes manifests in deploy/kubernetes/ against the Pod Security
Standards, judged by the admission controller's own code: tools/psa-check
(built here into .tools/bin/psa-check) runs k8s.io/pod-security-admission's
evaluator on every pod template at "restricted" and "baseline".

What each file may fail:
* kvtier-sidecar.yaml: nothing, at "restricted".
* every file, at "baseline": only hostPath volumes (check hostPathVolumes:
  kvtier-node's socket and disk directories, the CSI plugin's kubelet
  directories) and a privileged container whose name contains "csi" (check
  privileged: the CSI plugin mounts into the kubelet's pod directories with
  Bidirectional propagation, which needs it). No capability check is
  excused: the plugin drops ALL and adds none (privileged grants them), and a
  root init container may add only what "baseline" allows.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from perf import gotools
from test_deploy import _header_example

from conftest import REPO_ROOT

KUBERNETES = REPO_ROOT / "deploy" / "kubernetes"
#: Baseline failures a file may have, and who may cause them (see the docstring).
EXCUSED = {"hostPathVolumes", "privileged"}


@pytest.fixture(scope="session")
def psa_check() -> Path:
    """tools/psa-check, built when missing or stale (perf/gotools.py)."""
    try:
        return gotools.build("psa-check")
    except gotools.GoToolError as e:
        pytest.fail(str(e))


def _evaluate(binary: Path, *paths: Path) -> dict[str, Any]:
    r = subprocess.run([str(binary), *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _objects(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for f in report["files"] for o in f["objects"]]


def _baseline_problems(report: dict[str, Any]) -> list[str]:
    """Every baseline failure that EXCUSED does not allow, as a line of text."""
    problems = []
    for f in report["files"]:
        for o in f["objects"]:
            for c in o["levels"]["baseline"]["failed"]:
                where = f"{Path(f['file']).name}: {o['kind']} {o['name']}: {c['id']} ({c['detail']})"
                if c["id"] not in EXCUSED:
                    problems.append(where)
                elif c["id"] == "privileged" and (c["pod"] or not c["containers"]
                                                  or not all("csi" in n for n in c["containers"])):
                    problems.append(f"{where}: privileged outside a CSI plugin container")
    return problems


def _restricted_problems(report: dict[str, Any]) -> list[str]:
    return [f"{o['kind']} {o['name']}: {c['id']} ({c['detail']})"
            for o in _objects(report) for c in o["levels"]["restricted"]["failed"]]


def test_every_manifest_is_read(psa_check):
    files = sorted(KUBERNETES.glob("*.yaml"))
    report = _evaluate(psa_check, *files)
    assert [Path(f["file"]).name for f in report["files"]] == [f.name for f in files]
    for f in report["files"]:
        kinds = {d["kind"] for d in yaml.safe_load_all(Path(f["file"]).read_text()) if d}
        templates = kinds & {"Deployment", "DaemonSet", "StatefulSet"}
        assert {o["kind"] for o in f["objects"]} == templates, f"{f['file']}: a pod template was skipped"


def test_every_sidecar_pod_passes_restricted(psa_check):
    report = _evaluate(psa_check, KUBERNETES / "kvtier-sidecar.yaml")
    assert _objects(report), "kvtier-sidecar.yaml holds a pod template"
    assert _restricted_problems(report) == []
    assert all(o["levels"]["restricted"]["allowed"] for o in _objects(report))


@pytest.mark.parametrize("manifest", sorted(p.name for p in KUBERNETES.glob("*.yaml")))
def test_nothing_fails_baseline_but_host_paths_and_the_csi_plugin(psa_check, manifest):
    assert _baseline_problems(_evaluate(psa_check, KUBERNETES / manifest)) == []


def test_the_node_files_engines_pass_restricted_unless_they_mount_the_host(psa_check, tmp_path):
    """kvtier-node.yaml's example engine (the CSI volume) passes "restricted";
    the same engine with the header's hostPath mount instead fails
    "baseline", for that volume alone."""
    example = _header_example((KUBERNETES / "kvtier-node.yaml").read_text())
    path = tmp_path / "engine.yaml"
    path.write_text(example)
    assert _restricted_problems(_evaluate(psa_check, path)) == []
    engine = yaml.safe_load(example)
    volumes = engine["spec"]["template"]["spec"]["volumes"]
    kvtier = next(v for v in volumes if "csi" in v)
    del kvtier["csi"]
    kvtier["hostPath"] = {"path": "/run/kvtier", "type": "Directory"}
    path.write_text(yaml.safe_dump(engine))
    verdict = _objects(_evaluate(psa_check, path))[0]["levels"]["baseline"]
    assert not verdict["allowed"] and [c["id"] for c in verdict["failed"]] == ["hostPathVolumes"]


def test_the_check_flags_what_it_must(psa_check, tmp_path):
    """The checks above can fail: the sidecar file with hostPID, and with a
    privileged container that is not a CSI plugin, is reported."""
    docs = list(yaml.safe_load_all((KUBERNETES / "kvtier-sidecar.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    pod["hostPID"] = True
    pod["containers"][0]["securityContext"]["privileged"] = True
    broken = tmp_path / "kvtier-sidecar.yaml"
    broken.write_text(yaml.safe_dump_all(docs))
    report = _evaluate(psa_check, broken)
    failed = {c["id"]: c for c in _objects(report)[0]["levels"]["baseline"]["failed"]}
    assert failed["hostNamespaces"]["pod"] is True and "hostPID" in failed["hostNamespaces"]["detail"]
    assert failed["privileged"]["containers"] == [pod["containers"][0]["name"]]
    problems = _baseline_problems(report)
    assert any("hostNamespaces" in p for p in problems) and any("outside a CSI plugin" in p for p in problems)
    assert _restricted_problems(report), "restricted includes baseline"
    # A field the API does not have is an error, not a silently passed pod.
    pod["hostPid"] = pod.pop("hostPID")
    broken.write_text(yaml.safe_dump_all(docs))
    r = subprocess.run([str(psa_check), str(broken)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "hostPid" in r.stderr
