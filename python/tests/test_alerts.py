"""The alert rules and the Grafana dashboard in deploy/ (docs/operations.md,
"Alerts and dashboard"): promtool accepts the rules and their unit tests
prove each alert fires on its fault (and that the unit tests can fail); the
dashboard's queries parse; every alert has a runbook line; and every metric a
rule or a panel queries is on the /metrics of a real server running the tiers
and the cluster those metrics describe."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from kvtier import Block, Client, keys
from kvtier.server import Server, free_port_pairs

from conftest import REPO_ROOT

RULES = REPO_ROOT / "deploy" / "prometheus" / "kvtier-alerts.yaml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "kvtier-alerts.test.yaml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "kvtier-dashboard.json"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"

#: Series Prometheus makes itself, not the server.
SYNTHETIC = {"up"}

#: What a dashboard query's Grafana variables stand for when promtool parses it.
GRAFANA_VARS = {"$__rate_interval": "5m", "$instance": ".*"}

#: PromQL words that look like metric names: operators, modifiers, and the
#: keywords that take a label list (what follows those is stripped first).
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                "group_left", "group_right", "inf", "nan", "start", "end"}


def _promtool() -> str:
    """scripts/setup.sh --test's copy in .tools/bin, else one on PATH; never a skip."""
    found = shutil.which("promtool", path=str(REPO_ROOT / ".tools" / "bin")) or shutil.which("promtool")
    if not found:
        pytest.fail("promtool is not installed (scripts/setup.sh --test puts it in .tools/bin)")
    return found


def _run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120)


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", q["query"]))
    return exprs


def _for_promtool(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not
    functions (followed by `(`), keywords, label names (inside `{}` or a
    `by (...)` list), strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, label values included
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", e):
        if not m.group(2) and m.group(1).lower() not in PROMQL_WORDS:
            names.add(m.group(1))
    return names


def exported_names(exposition: str) -> set[str]:
    """Every series name a scrape of this text can give: its samples' names,
    and the names of the families it declares (`# TYPE`), with the suffixes
    their samples take (a counter's `_total`, a histogram's `_bucket`,
    `_sum`, `_count`: never the bare family name), so that a family with no
    sample yet still counts."""
    names = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["_sum", "_count"]}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.update([name + s for s in suffixes[kind]] if kind in suffixes else [name])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][\w:]*", line).group(0))
    return names


def test_metric_names_are_read_from_promql():
    assert metric_names('sum by (instance, peer) (increase(kvtier_cluster_failovers_total{instance=~"$instance"}[5m])) >= 3') \
        == {"kvtier_cluster_failovers_total"}
    assert metric_names('a_bytes > 0.8 * b_capacity or on (job) c{x="or d"} unless ignoring (le) rate(d_total[1m:10s] offset 5m)') \
        == {"a_bytes", "b_capacity", "c", "d_total"}
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))') == {"x_bucket"}


def test_alert_rules_pass_promtool_check():
    r = _run_promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_fires_on_its_fault_in_promtool_unit_tests():
    r = _run_promtool("test", "rules", str(RULE_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr
    # ... and none is left out: each is shown firing somewhere.
    tested = {a["alertname"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for a in t["alert_rule_test"] if a.get("exp_alerts")}
    assert {r["alert"] for r in _rules()} == tested


def test_the_unit_tests_catch_a_broken_rule(tmp_path):
    """A rule whose threshold is wrong fails its unit test: they can fail."""
    broken = RULES.read_text().replace("rate(kvtier_requests_total[5m])) > 0.01", "rate(kvtier_requests_total[5m])) > 0.5")
    assert broken != RULES.read_text(), "KvtierShedding's threshold moved: update this test"
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    r = _run_promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert r.returncode != 0 and "KvtierShedding" in r.stdout + r.stderr, r.stdout + r.stderr


def test_every_alert_has_severity_for_annotations_and_a_runbook_line():
    section = OPERATIONS.read_text().split("## Alerts and dashboard", 1)
    assert len(section) == 2, "docs/operations.md lost its \"Alerts and dashboard\" section"
    runbook = section[1].split("\n## ", 1)[0]
    for r in _rules():
        name = r["alert"]
        assert r["labels"]["severity"] in ("warning", "critical"), name
        assert "for" in r, f"{name}: a `for:` keeps one bad scrape from paging"
        assert r["annotations"]["summary"] and name in r["annotations"]["description"], name
        assert '"Alerts and dashboard"' in r["annotations"]["description"], name
        assert re.search(rf"^\| `{name}` \|", runbook, re.M), f"{name} has no runbook row in docs/operations.md"


def test_dashboard_queries_parse_and_show_every_fault(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in graphs)
    # promtool parses PromQL: each query becomes a recording rule.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": _for_promtool(e)} for i, e in enumerate(_dashboard_exprs())]}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    r = _run_promtool("check", "rules", str(tmp_path / "dashboard-rules.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    # The soak's faults (docs/operations.md, "Alerts and dashboard"), each on a panel.
    shown = set().union(*map(metric_names, _dashboard_exprs()))
    faults = {"kvtier_shed_total", "kvtier_cluster_failovers_total", "kvtier_object_errors_total",
              "kvtier_object_writeback_queue_depth", "kvtier_object_upload_lag_seconds",
              "kvtier_disk_write_exhausted_total", "kvtier_process_resident_bytes",
              "kvtier_resident_limit_bytes", "kvtier_request_duration_seconds_bucket"}
    assert faults <= shown, faults - shown


@pytest.fixture(scope="module")
def full_server(kvtier_bin, tmp_path_factory):
    """A server with every family the rules and the dashboard query: a disk
    tier, an object store (file://, a real store on the local file system)
    and a cluster whose other member is not running, so calls to it fail over."""
    d = tmp_path_factory.mktemp("alerts")
    (d / "disk").mkdir()
    (d / "objects").mkdir()
    me, dead = free_port_pairs(2)
    s = Server.start(binary=kvtier_bin, listen=f"127.0.0.1:{me}", args=[
        "--memory-capacity", "64MiB", "--disk-dir", str(d / "disk"), "--object-store", f"file://{d / 'objects'}",
        "--cluster-nodes", f"grpc://127.0.0.1:{me},grpc://127.0.0.1:{dead}",
        "--cluster-self", f"grpc://127.0.0.1:{me}",
    ])
    yield s
    assert s.stop() == 0


def test_every_metric_the_rules_and_dashboard_query_is_exported(full_server):
    ks = keys.chain(list(range(4 * 128)))
    blocks = [Block(k, bytes([i]) * 4096, parent=ks[i - 1] if i else None, token_count=128) for i, k in enumerate(ks)]
    with Client(full_server.grpc, timeout=30.0) as c:
        assert c.write("alerts", blocks).stored == len(blocks)
        assert c.read("alerts", ks).payloads == [b.payload for b in blocks]
    text = urllib.request.urlopen(f"http://{full_server.http}/metrics", timeout=10).read().decode()
    exported = exported_names(text)
    # The cluster's other member is down: the write failed over (a sample, not just the family).
    assert re.search(r"^kvtier_cluster_failovers_total\{", text, re.M), "no failover was counted"
    queried = {(where, n) for r in _rules() for n in metric_names(r["expr"]) for where in [f"alert {r['alert']}"]}
    queried |= {("dashboard", n) for e in _dashboard_exprs() for n in metric_names(e)}
    assert len({n for _, n in queried}) > 30, "metric_names found too few names: is it broken?"
    missing = sorted((where, n) for where, n in queried if n not in exported and n not in SYNTHETIC)
    assert not missing, f"queried but not on /metrics: {missing}"
    # The check can fail: a misspelt name is caught.
    assert "kvtier_shed_totl" not in exported
    # The memory panel's numbers are real: the default server.resident_limit
    # of a 64 MiB tier (docs/operations.md, "Memory") and the kernel's VmRSS.
    cap = 64 << 20
    assert _sample(text, "kvtier_resident_limit_bytes") == cap // 10 * 11 + max(cap // 4, 64 << 20) + (64 << 20)
    status = Path(f"/proc/{full_server.pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) << 10
    assert 0.75 * rss < _sample(text, "kvtier_process_resident_bytes") < 1.25 * rss


def _sample(exposition: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", exposition, re.M)
    assert m, f"no {name} sample"
    return float(m.group(1))
