"""The deployment files in deploy/ are valid: the Kubernetes manifests against
the Kubernetes API schema (kubernetes-validate, strict: unknown fields fail),
the systemd unit with systemd-analyze, the Dockerfile's shape, and every kvtier
config they carry with the real binary (unknown keys are refused)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

from conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(__import__("sys").executable).parent))
    if not found:
        pytest.fail(f"{name} is not installed (scripts/setup.sh --test installs it)")
    return found


def _check_config(kvtier_bin, toml_text: str, tmp_path: Path, env: dict[str, str] | None = None) -> str:
    p = tmp_path / "kvtier.toml"
    p.write_text(toml_text)
    r = subprocess.run([str(kvtier_bin), "serve", "--config", str(p), "--print-config"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, f"kvtier refuses the config:\n{r.stderr}"
    return r.stdout


def _manifests(name: str, text: str | None = None) -> dict[tuple[str, str], Any]:
    text = (DEPLOY / "kubernetes" / name).read_text() if text is None else text
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text)}


def _check_statefulset(docs: dict[tuple[str, str], Any], name: str) -> tuple[dict, dict, dict[str, int]]:
    """What both manifests share: selectors, the headless Service, probes,
    scraping, non-root. Returns the StatefulSet, its container and its ports."""
    sts = docs[("StatefulSet", name)]
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
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert ("ConfigMap", volumes["config"]["configMap"]["name"]) in docs
    return sts, c, ports


@pytest.mark.parametrize("manifest", sorted(p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")))
def test_kubernetes_manifests_validate_against_the_api_schema(manifest):
    r = subprocess.run([_tool("kubernetes-validate"), "--strict", "--quiet", "--no-warn",
                        str(DEPLOY / "kubernetes" / manifest)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kubernetes_manifests_hang_together(kvtier_bin, tmp_path):
    docs = _manifests("kvtier.yaml")
    sts, c, ports = _check_statefulset(docs, "kvtier")
    pod = sts["spec"]["template"]
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


def _documented_secrets(text: str) -> dict[str, set[str]]:
    """The `kubectl create secret generic NAME --from-...` commands of a
    manifest's header comment: each Secret's name and its keys."""
    header = "\n".join(line[1:].strip() for line in text.splitlines() if line.startswith("#"))
    secrets: dict[str, set[str]] = {}
    for name, args in re.findall(r"kubectl (?:-n \S+ )?create secret generic (\S+)((?:.*\\\n)*.*)", header):
        secrets[name] = {m[0] or Path(m[1]).name
                         for m in re.findall(r"--from-(?:literal|file)=(?:([\w.-]+)=)?([^\s\]]*)", args)}
    return secrets


def _pod_env(container: dict, field_values: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: downward-API
    fields from `field_values`, Secret keys as placeholders (optional ones left
    out), `$(VAR)` expanded from the variables defined before it."""
    env: dict[str, str] = {}
    for e in container["env"]:
        if "value" in e:
            for ref in re.findall(r"\$\((\w+)\)", e["value"]):
                assert ref in env, f"{e['name']} uses $({ref}) before it is defined: the kubelet would not expand it"
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif not e["valueFrom"]["secretKeyRef"].get("optional"):
            env[e["name"]] = "placeholder"
    return env


def test_kubernetes_cluster_manifest_hangs_together(kvtier_bin, tmp_path):
    text = (DEPLOY / "kubernetes" / "kvtier-cluster.yaml").read_text()
    docs = _manifests("kvtier-cluster.yaml")
    sts, c, ports = _check_statefulset(docs, "kvtier-cluster")
    pod = sts["spec"]["template"]
    labels = pod["metadata"]["labels"]
    single = _manifests("kvtier.yaml")[("StatefulSet", "kvtier")]["spec"]["template"]["metadata"]["labels"]
    for svc in (d for (k, _), d in docs.items() if k == "Service"):
        assert not svc["spec"]["selector"].items() <= single.items(), "selects the single-node pods too"
    headless = docs[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["publishNotReadyAddresses"] is False, "membership holds only ready pods"
    pdb = docs[("PodDisruptionBudget", "kvtier-cluster")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items() and pdb["spec"]["maxUnavailable"] == 1
    anti = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # Every Secret the pod uses is created in the header's instructions, with every key it reads.
    secrets = _documented_secrets(text)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "tokens.toml" in secrets[volumes["tokens"]["secret"]["secretName"]]
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["key"] in secrets.get(ref["name"], set()), f"{e['name']}: {ref} is not in the header's commands"
    # Identity: the pod's stable StatefulSet DNS name (kept across restarts,
    # so a restarted pod keeps its placement); membership: the headless
    # Service in the pod's namespace; peers present the cluster token.
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["KVTIER_CLUSTER_SELF"]["value"] == (
        f"grpc://$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:{ports['grpc']}")
    assert env["KVTIER_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "kvtier-cluster-token"
    dns_host, dns_port = env["KVTIER_CLUSTER_DNS"]["value"].rsplit(":", 1)
    assert dns_host == f"{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local"
    assert int(dns_port) == ports["grpc"], "every DNS record + this port is a node's gRPC address"
    assert any(p["port"] == ports["grpc"] for p in headless["spec"]["ports"])
    toml_text = docs[("ConfigMap", "kvtier-cluster")]["data"]["kvtier.toml"]
    cfg = tomllib.loads(toml_text)
    assert sts["spec"]["replicas"] >= cfg["cluster"]["replicas"] >= 2
    assert cfg["object_store"]["url"], "a cluster needs the shared object store"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert cfg["disk"]["dir"].startswith(mounts["data"] + "/"), "the disk tier lives on the pod's volume"
    assert cfg["auth"]["tokens_file"] == f"{mounts['tokens']}/tokens.toml"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    # kvtier accepts the config with the pod's environment, on loopback: the
    # pod's IP is 127.0.0.1, the DNS name one that resolves here.
    pod_env = _pod_env(c, {"metadata.name": "kvtier-cluster-0", "metadata.namespace": "test"})
    pod_env["KVTIER_CLUSTER_DNS"] = f"localhost:{dns_port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVTIER_", "AWS_", "AZURE_"))}
    effective = tomllib.loads(_check_config(kvtier_bin, toml_text, tmp_path, env=base | pod_env))
    assert effective["cluster"]["self"] == (
        f"grpc://kvtier-cluster-0.{headless['metadata']['name']}.test.svc.cluster.local:{ports['grpc']}")
    assert effective["cluster"]["dns"] == f"localhost:{ports['grpc']}"
    assert effective["cluster"]["insecure_dns"] is True, "dns with KVTIER_CLUSTER_TOKEN is refused without it"
    assert effective["cluster"]["replicas"] == cfg["cluster"]["replicas"]
    assert effective["object_store"]["url"] == cfg["object_store"]["url"]
    assert effective["server"]["listen"] == [f"0.0.0.0:{ports['grpc']}"]


def _size(s: str) -> int:
    """Bytes of a kvtier size ("24GiB") or a Kubernetes quantity ("32Gi")."""
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", s)
    assert m, f"not a size: {s!r}"
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))


_EXAMPLE = re.compile(r"^# --- begin example engine ---\n(.*?)^# --- end example engine ---$", re.M | re.S)


def _header_example(text: str) -> str:
    """The example engine manifest between the header's begin/end lines, uncommented."""
    m = _EXAMPLE.search(text)
    assert m, "the header shows an example engine pod"
    return textwrap.dedent("\n".join(line[1:] for line in m.group(1).splitlines()))


def _security(pod_spec: dict, container: dict) -> dict:
    """A container's effective securityContext: the pod's, overridden by its own."""
    return pod_spec.get("securityContext", {}) | container.get("securityContext", {})


def _assert_unprivileged(pod_spec: dict, c: dict) -> dict:
    """kvtier's container on the same-host path: no host namespace, no
    capability, no privilege, not root, seccomp on. Returns its effective
    securityContext."""
    for host in ("hostPID", "hostIPC", "hostNetwork"):
        assert not pod_spec.get(host), f"{host}: shared memory over the socket needs no host namespace"
    sc = _security(pod_spec, c)
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), sc["capabilities"]
    assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] not in (None, 0), "kvtier runs as non-root"
    assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert not any(p.get("hostPort") for p in c["ports"]), "no host ports"
    return sc


def _check_kvtier_container(docs, pod: dict, c: dict, tmp_path: Path, kvtier_bin, prefix: str) -> dict:
    """What the node and sidecar files share: probes, scraping, the config
    kvtier accepts with the pod's environment (its IP 127.0.0.1, a DNS name
    that resolves here), membership through the headless Service
    `prefix`-headless, the cluster token, the memory bound. Returns the
    effective config."""
    spec = pod["spec"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and ports.get(get["port"], get["port"]) == ports["http"], probe
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["http"]
    assert ann["prometheus.io/path"] == "/metrics"
    res = c["resources"]
    assert {"cpu", "memory"} <= res["requests"].keys()
    assert _size(res["requests"]["memory"]) <= _size(res["limits"]["memory"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    toml_text = docs[("ConfigMap", volumes[mounts["/etc/kvtier"]]["configMap"]["name"])]["data"]["kvtier.toml"]
    pod_env = _pod_env(c, {"status.podIP": "127.0.0.1", "metadata.namespace": "test"})
    headless = docs[("Service", f"{prefix}-headless")]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is False
    assert headless["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    dns_host, dns_port = pod_env["KVTIER_CLUSTER_DNS"].rsplit(":", 1)
    assert dns_host == f"{headless['metadata']['name']}.test.svc.cluster.local"
    assert int(dns_port) == ports["grpc"] and any(p["port"] == ports["grpc"] for p in headless["spec"]["ports"])
    pod_env["KVTIER_CLUSTER_DNS"] = f"localhost:{dns_port}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVTIER_", "AWS_", "AZURE_"))}
    effective = tomllib.loads(_check_config(kvtier_bin, toml_text, tmp_path, env=base | pod_env))
    assert effective["server"]["listen"] == [f"0.0.0.0:{ports['grpc']}"]
    assert effective["server"]["http_listen"].endswith(f":{ports['http']}")
    assert effective["engine"]["memory_capacity"] and (
        _size(effective["engine"]["memory_capacity"]) * 6 // 5 <= _size(res["limits"]["memory"])), "blocks + ~20%"
    assert effective["cluster"]["self"] == f"grpc://127.0.0.1:{ports['grpc']}", "a pod is named by its IP"
    assert effective["cluster"]["replicas"] >= 2 and effective["object_store"]["url"]
    assert effective["cluster"]["insecure_dns"] is True, "dns with KVTIER_CLUSTER_TOKEN is refused without it"
    assert effective["auth"]["public_health"] and effective["auth"]["public_metrics"], "probes carry no token"
    env = {e["name"]: e for e in c["env"]}
    assert env["KVTIER_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "kvtier-cluster-token"
    tokens = Path(effective["auth"]["tokens_file"])
    assert volumes[mounts[str(tokens.parent)]]["secret"]["secretName"] == "kvtier-tokens"
    return effective


def _check_socket(effective: dict, sc: dict, engine_spec: dict, engine: dict, text: str) -> Path:
    """The socket's mode lets its group connect, and nobody else; the server
    gives it that owner without CAP_CHOWN (its own UID, one of its groups);
    the engine is in that group, names the socket's URL and kvtier's uid
    (its client checks the listener's). Returns the socket's directory."""
    sock = Path(effective["server"]["local_listen"])
    mode = int(effective["server"]["local_mode"], 8)
    assert mode & 0o060 == 0o060 and mode & 0o007 == 0, oct(mode)
    uid, gid = (int(x) for x in effective["server"]["local_owner"].split(":"))
    assert uid == sc["runAsUser"] and gid in [sc.get("runAsGroup"), *sc.get("supplementalGroups", [])]
    esc = _security(engine_spec, engine)
    assert gid in [esc.get("runAsGroup"), *esc.get("supplementalGroups", [])], "the engine is in the socket's group"
    url = f"unix://{sock}"
    assert url in _EXAMPLE.sub("", text.split("\napiVersion:", 1)[0]), f"the header tells engines the URL {url}"
    assert any(f'"url":"{url}"' in a for a in engine["args"])
    env = {e["name"]: e for e in engine["env"]}
    assert env["KVTIER_SERVER_UID"]["value"] == str(uid), "the engine's client must accept kvtier's uid"
    assert env["KVTIER_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    engine_mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert engine_mounts[str(sock.parent)]["readOnly"] is True, "connecting writes nothing to the mount"
    return sock.parent


def _check_documented_secrets(text: str, *containers: dict) -> None:
    """Every Secret the containers use is created in the header's instructions, with every key they read."""
    secrets = _documented_secrets(text)
    assert "tokens.toml" in secrets["kvtier-tokens"]
    for c in containers:
        for e in c["env"]:
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets.get(ref["name"], set()), f"{e['name']}: {ref} is not in the header"


def _flags(args: list[str]) -> dict[str, str]:
    """Go-style `-name=value` arguments (SPIFFE's CSI driver, the registrar)."""
    return dict(a.lstrip("-").split("=", 1) for a in args)


def _check_node_manifest(text: str, kvtier_bin, tmp_path: Path) -> None:
    """kvtier-node.yaml (given as text, so a test can break it): one kvtier per
    node, unprivileged, its socket's host directory served to the engine pods
    by a CSI driver (SPIFFE's), the nodes one cluster over the object store."""
    docs = _manifests("kvtier-node.yaml", text)
    ds = docs[("DaemonSet", "kvtier-node")]
    pod = ds["spec"]["template"]
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    others = [_manifests(f)[("StatefulSet", n)]["spec"]["template"]["metadata"]["labels"]
              for f, n in (("kvtier.yaml", "kvtier"), ("kvtier-cluster.yaml", "kvtier-cluster"))]
    for svc in (d for (k, _), d in docs.items() if k == "Service"):
        assert svc["spec"]["selector"].items() <= labels.items()
        for other in others:
            assert not svc["spec"]["selector"].items() <= other.items(), "selects another manifest's pods too"
    rolling = ds["spec"]["updateStrategy"]["rollingUpdate"]
    assert str(rolling.get("maxSurge", 0)) == "0", "two kvtiers on one node would contend for the socket"
    c = next(c for c in spec["containers"] if c["name"] == "kvtier")
    sc = _assert_unprivileged(spec, c)
    effective = _check_kvtier_container(docs, pod, c, tmp_path, kvtier_bin, "kvtier-node")
    # Host access: the socket's directory and the disk, nothing else.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    sock_dir = str(Path(effective["server"]["local_listen"]).parent)
    host = volumes[mounts[sock_dir]].get("hostPath")
    assert host and host["type"] == "DirectoryOrCreate", "the socket's directory is the node's"
    data = Path(effective["disk"]["dir"])
    disk = [n for m, n in mounts.items() if data.is_relative_to(m) and volumes[n].get("hostPath")]
    assert disk, "the disk tier is on the node's disk"
    assert {n for n, v in volumes.items() if "hostPath" in v} == {mounts[sock_dir], *disk}
    # An init container may hand the directories to kvtier's user: as root
    # with CAP_CHOWN at most, mounting only those directories.
    for init in spec.get("initContainers", []):
        isc = _security(spec, init)
        assert set(isc["capabilities"].get("add", [])) <= {"CHOWN"} and isc["capabilities"]["drop"] == ["ALL"]
        assert not isc.get("privileged") and isc["allowPrivilegeEscalation"] is False
        assert {m["name"] for m in init["volumeMounts"]} <= {mounts[sock_dir], *disk}
    _check_documented_secrets(text, c)
    # The CSI driver: SPIFFE's, serving that host directory under the
    # CSIDriver's name, registered with the kubelet under the same name.
    driver = next(d for (k, _), d in docs.items() if k == "CSIDriver")
    name = driver["metadata"]["name"]
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"] and driver["spec"]["attachRequired"] is False
    assert driver["spec"]["podInfoOnMount"] is True, "the driver refuses non-ephemeral volumes with it"
    csi = docs[("DaemonSet", "kvtier-csi")]["spec"]["template"]["spec"]
    assert csi["nodeSelector"] == spec["nodeSelector"], "a CSI plugin wherever kvtier runs"
    assert not docs[("DaemonSet", "kvtier-csi")]["spec"]["template"]["metadata"]["labels"].items() >= {
        "app.kubernetes.io/name": "kvtier"}.items(), "no kvtier Service selects the plugin"
    csi_volumes = {v["name"]: v for v in csi["volumes"]}
    plugin = next(p for p in csi["containers"] if "spiffe-csi-driver" in p["image"])
    assert "csi" in plugin["name"] and plugin["securityContext"]["privileged"] is True
    flags = _flags(plugin["args"])
    assert flags["plugin-name"] == name
    served = next(m for m in plugin["volumeMounts"] if m["mountPath"] == flags["workload-api-socket-dir"])
    assert csi_volumes[served["name"]]["hostPath"]["path"] == host["path"], "it serves kvtier's socket directory"
    assert any(m["mountPath"] == "/var/lib/kubelet/pods" and m["mountPropagation"] == "Bidirectional"
               for m in plugin["volumeMounts"])
    plugin_env = {e["name"]: e for e in plugin["env"]}
    assert plugin_env["MY_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    registrar = next(p for p in csi["containers"] if "csi-node-driver-registrar" in p["image"])
    rflags = _flags(registrar["args"])
    assert rflags["csi-address"] == flags["csi-socket-path"]
    socket_dir = {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}[str(Path(flags["csi-socket-path"]).parent)]
    assert rflags["kubelet-registration-path"] == f"{csi_volumes[socket_dir]['hostPath']['path']}/csi.sock"
    assert rflags["kubelet-registration-path"] == f"/var/lib/kubelet/plugins/{name}/csi.sock"
    # The header's example engine: a valid Deployment on the same nodes,
    # mounting the CSI volume where the socket is, in the socket's group.
    example = tmp_path / "engine.yaml"
    example.write_text(_header_example(text))
    r = subprocess.run([_tool("kubernetes-validate"), "--strict", "--quiet", "--no-warn", str(example)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    engine_spec = yaml.safe_load(example.read_text())["spec"]["template"]["spec"]
    engine = engine_spec["containers"][0]
    assert spec["nodeSelector"].items() <= engine_spec["nodeSelector"].items(), "engines land where kvtier runs"
    sock_parent = _check_socket(effective, sc, engine_spec, engine, text)
    engine_volumes = {v["name"]: v for v in engine_spec["volumes"]}
    mount = next(m for m in engine["volumeMounts"] if m["mountPath"] == str(sock_parent))
    assert engine_volumes[mount["name"]].get("csi") == {"driver": name, "readOnly": True}, "SPIFFE's driver wants readOnly"
    assert not any("hostPath" in v for v in engine_volumes.values()), "the engine needs no hostPath"
    header = text.split("\napiVersion:", 1)[0]
    assert f"hostPath: {{path: {host['path']}" in _EXAMPLE.sub("", header), "the weaker choice is documented"
    assert "LimitMEMLOCK" in header and "memlock" in header, "the memlock limit of GPU engines is documented"


def test_kubernetes_node_daemonset_hangs_together(kvtier_bin, tmp_path):
    _check_node_manifest((DEPLOY / "kubernetes" / "kvtier-node.yaml").read_text(), kvtier_bin, tmp_path)


def test_kubernetes_node_daemonset_refuses_the_old_privileges(kvtier_bin, tmp_path):
    """The node check fails on what the process_vm path needed: hostPID, SYS_PTRACE, UID 0."""
    text = (DEPLOY / "kubernetes" / "kvtier-node.yaml").read_text()
    pod_level = "      automountServiceAccountToken: false\n      securityContext:\n        # The image"
    caps = "          capabilities:\n              drop: [ALL]\n          volumeMounts:\n            - {name: config"
    uid = "        runAsNonRoot: true\n        runAsUser: 10001\n"
    for old, new, why in (
            (pod_level, pod_level.replace("false\n", "false\n      hostPID: true\n"), "hostPID"),
            (caps, caps.replace("[ALL]\n", "[ALL]\n              add: [SYS_PTRACE]\n"), "SYS_PTRACE"),
            (uid, "        runAsNonRoot: false\n        runAsUser: 0\n", "non-root")):
        assert text.count(old) == 1, old
        with pytest.raises(AssertionError, match=why):
            _check_node_manifest(text.replace(old, new), kvtier_bin, tmp_path)


def test_kubernetes_sidecar_hangs_together(kvtier_bin, tmp_path):
    """kvtier-sidecar.yaml: kvtier as a native sidecar of an engine pod, the
    socket in an emptyDir both mount, the disk tier on bounded ephemeral
    storage, the pods one cluster over the object store; no host access."""
    text = (DEPLOY / "kubernetes" / "kvtier-sidecar.yaml").read_text()
    docs = _manifests("kvtier-sidecar.yaml", text)
    deploy = next(d for (k, _), d in docs.items() if k == "Deployment")
    pod = deploy["spec"]["template"]
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for f in ("kvtier.yaml", "kvtier-cluster.yaml", "kvtier-node.yaml"):
        for (kind, _), d in _manifests(f).items():
            if kind == "Service":
                assert not d["spec"]["selector"].items() <= labels.items(), f"{f} selects the engine pods"
    others = [t["spec"]["template"]["metadata"]["labels"] for f in ("kvtier.yaml", "kvtier-cluster.yaml",
              "kvtier-node.yaml") for (k, _), t in _manifests(f).items() if k in ("StatefulSet", "DaemonSet")]
    for svc in (d for (k, _), d in docs.items() if k == "Service"):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert not any(svc["spec"]["selector"].items() <= o.items() for o in others), "selects kvtier pods"
    c = next(c for c in spec["initContainers"] if c["name"] == "kvtier")
    assert c["restartPolicy"] == "Always", "a native sidecar"
    assert "startupProbe" in c, "the engine starts once kvtier listens"
    sc = _assert_unprivileged(spec, c)
    effective = _check_kvtier_container(docs, pod, c, tmp_path, kvtier_bin, "vllm-kvtier")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert not any("hostPath" in v for v in volumes.values()), "no host access"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    engine = spec["containers"][0]
    sock_dir = _check_socket(effective, sc, spec, engine, text)
    shared = mounts[str(sock_dir)]
    assert "emptyDir" in volumes[shared], "the socket's directory is the pod's"
    assert any(m["name"] == shared for m in engine["volumeMounts"])
    esc = _security(spec, engine)
    assert esc["runAsUser"] != sc["runAsUser"], "the engine is not kvtier's user"
    data = Path(effective["disk"]["dir"])
    disk = next(n for m, n in mounts.items() if data.is_relative_to(m))
    assert not any(m["name"] == disk for m in engine["volumeMounts"]), "the disk tier is kvtier's alone"
    limit = volumes[disk]["emptyDir"]["sizeLimit"]
    assert _size(effective["disk"]["capacity"]) < _size(limit), "the kubelet evicts the pod past its sizeLimit"
    assert _size(c["resources"]["requests"]["ephemeral-storage"]) >= _size(limit)
    _check_documented_secrets(text, c, engine)
    assert "LimitMEMLOCK" in text.split("\napiVersion:", 1)[0], "the memlock limit of GPU engines is documented"


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
