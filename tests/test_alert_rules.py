"""deploy/prometheus/kvest-alerts.yml: valid rules (promtool check rules),
alerts that fire on the series that should fire them and stay quiet on a
healthy scheduler (promtool test rules), and only series and labels
src/kvest/sglang/metrics.py exports."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "kvest-alerts.yml"
UNIT_TESTS = RULES_DIR / "kvest-alerts.test.yml"
METRICS = ROOT / "src" / "kvest" / "sglang" / "metrics.py"
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}

pytestmark = pytest.mark.skipif(not RULES.is_file() or not METRICS.is_file(),
                                reason="the source tree is not beside the tests")


def exported(source: str) -> dict[str, set[str]]:
    """Series name -> label names of every prometheus_client metric the
    source creates (``Counter("x", ...)`` is exported as ``x_total``)."""
    series: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("Counter", "Gauge", "Histogram", "Summary")):
            continue
        name = node.args[0].value
        labels = next((a for a in node.args[2:3] if isinstance(a, ast.List)), None)
        labels = labels or next((k.value for k in node.keywords if k.arg == "labelnames"), None)
        names = {e.value for e in labels.elts} if labels is not None else set()
        counter = node.func.id == "Counter"
        series[f"{name.removesuffix('_total')}_total" if counter else name] = names
    return series


def used(rules: str) -> tuple[set[str], set[str]]:
    """The kvest series and the label names the rules' expressions and
    templates use."""
    exprs = " ".join(re.findall(r"expr: (>\n(?:\s{10}.*\n)+|.*)", rules))
    names = set(re.findall(r"\bkvest_[a-z0-9_]+", exprs))
    labels = {label for group in re.findall(r"\b(?:by|on|without)\s*\(([^)]*)\)", exprs)
              for label in re.split(r"\s*,\s*", group.strip()) if label}
    labels |= set(re.findall(r"[{,]\s*([a-z_]+)\s*=~?", exprs))
    labels |= set(re.findall(r"\$labels\.([a-z_]+)", rules))
    return names, labels


def _alerts(text: str) -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", text, re.M)


def test_rules_use_only_series_and_labels_metrics_py_exports():
    series = exported(METRICS.read_text(encoding="utf-8"))
    assert {"kvest_estimate_undercount_total", "kvest_mode"} <= set(series)
    names, labels = used(RULES.read_text(encoding="utf-8"))
    assert names, "no kvest series found in the rules"
    assert names <= set(series), names - set(series)
    known = set().union(*(series[n] for n in names)) | TARGET_LABELS
    assert labels <= known, labels - known
    # and every series named anywhere in the file (comments, runbooks) exists
    rules = RULES.read_text(encoding="utf-8")
    assert set(re.findall(r"\bkvest_[a-z0-9_]+_(?:total|tokens)\b|\bkvest_mode\b", rules)) \
        <= set(series)


def test_a_renamed_metric_or_label_is_caught():
    """The other direction: the derivation follows the code."""
    source = ('from prometheus_client import Counter, Gauge\n'
              'c = Counter("kvest_renamed", "h", ["pool"], registry=None)\n'
              'g = Gauge("kvest_g", "h", registry=None)\n')
    assert exported(source) == {"kvest_renamed_total": {"pool"}, "kvest_g": set()}
    names, labels = used("expr: sum by (job, pool) (increase(kvest_old_total[5m])) > 0\n"
                         "summary: '{{ $labels.hotspot }}'\n")
    assert names == {"kvest_old_total"} and labels == {"job", "pool", "hotspot"}


def test_the_four_kinds_are_alerted_each_with_a_runbook():
    rules = RULES.read_text(encoding="utf-8")
    blocks = dict(zip(_alerts(rules), re.split(r"^\s*- alert: \w+$", rules, flags=re.M)[1:],
                      strict=True))
    wanted = {"kvest_estimate_undercount_total": "undercount",
              "kvest_kv_bookkeeping_gap_total": "bookkeeping gap",
              "kvest_shadow_mismatches_total": "shadow mismatch",
              "absent_over_time(kvest_mode": "not reporting"}
    for needle, kind in wanted.items():
        assert any(needle in block for block in blocks.values()), kind
    for name, block in blocks.items():
        for key in ("severity:", "summary:", "description:", "runbook:"):
            assert key in block, (name, key)
        assert f"docs/operations.md, {name}" in block, name
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in blocks:
        assert f"### {name} (" in page, name


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    alerts = set(_alerts(RULES.read_text(encoding="utf-8")))
    tests = UNIT_TESTS.read_text(encoding="utf-8")
    quiet = set(re.findall(r"alertname: (\w+), exp_alerts: \[\]", tests))
    firing = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels:", tests))
    assert alerts and quiet == alerts and firing == alerts
    healthy = tests.split("\n  - interval:")[1]  # the first case: every alert quiet
    assert set(re.findall(r"alertname: (\w+), exp_alerts: \[\]", healthy)) == alerts


def test_the_rules_ship_and_are_named_where_an_operator_looks():
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    assert "recursive-include deploy *.yml" in manifest
    for doc in ("operations.md", "audit.md"):
        assert "deploy/prometheus/kvest-alerts.yml" in (ROOT / "docs" / doc).read_text(
            encoding="utf-8"), doc


def test_audit_md_maps_every_pool_label_to_its_family():
    from kvest.sglang import registry
    from kvest.sglang.audit_run import Pool

    text = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    section = text.split("### The `pool` label")[1].split("###")[0]
    rows = dict(re.findall(r"^\| `([A-Z][\w.]+)`[^|]*\| `([\w-]+)` \|$", section, re.M))
    assert set(rows.values()) == {str(p.value) for p in Pool}
    for attach in registry.POOLS:
        assert attach.cls in rows, attach.cls
    for cls, composite in registry.COMPOSITES.items():
        for attr in composite.pools:
            assert f"{cls}.{attr}" in rows, (cls, attr)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("KVEST_REQUIRE_PROMTOOL") == "1":
            pytest.fail("KVEST_REQUIRE_PROMTOOL=1 but promtool is not on PATH")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_promtool_checks_the_rules():
    done = _run("check", "rules", RULES.name, cwd=RULES_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(_alerts(RULES.read_text(encoding='utf-8')))} rules found" in done.stdout


def test_promtool_unit_tests_pass():
    done = _run("test", "rules", UNIT_TESTS.name, cwd=RULES_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(("old", "new"), [
    ("kvest_estimate_undercount_total[10m])) > 0", "kvest_estimate_undercount_total[10m])) > 5"),
    ("kvest_kv_bookkeeping_gap_total[1h])) > 0", "kvest_kv_bookkeeping_gap_total[1h])) >= 0"),
    ("kvest_shadow_mismatches_total[10m])) > 0", "kvest_shadow_comparisons_total[10m])) > 0"),
    ("absent_over_time(kvest_mode[10m])", "absent_over_time(kvest_mode[1h])"),
])
def test_the_unit_tests_catch_a_broken_rule(old, new, tmp_path):
    """The other direction: a rule that no longer fires when it should (or
    fires when it should not) fails `promtool test rules`."""
    _promtool()
    rules = RULES.read_text(encoding="utf-8")
    assert old in rules
    (tmp_path / RULES.name).write_text(rules.replace(old, new), encoding="utf-8")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = _run("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr
