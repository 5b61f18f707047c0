"""The Grafana dashboard and the Prometheus rules read only what ridgeserve really exposes.

Starts the real `ridgeserve` (default model and maps, loopback, RidgeFill shadow sampling and
online calibration on), scrapes its /metrics once the shadow series by split layer are there,
and checks:
  * deploy/grafana/ridgeserve.json parses, is importable as-is (the data source is the
    `datasource` template variable, used by every panel and target), and has the panels the
    issue asks for;
  * every ridgeserve_* name in every panel's PromQL and in every rule expression is a series
    name of the scrape (histograms as _bucket/_sum/_count), every label a matcher or `by`
    clause uses exists on those metrics (or is a target label: job, instance), and every
    recording rule the alerts read is defined.
The PromQL itself is run against a real Prometheus in tests/server/test_metrics.py.
"""

import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))

from rs_testlib import MAPS, SOURCE_DIR, Checks, Server, expect  # noqa: E402

import yaml  # noqa: E402

DASHBOARD = os.path.join(SOURCE_DIR, "deploy", "grafana", "ridgeserve.json")
RULES_DIR = os.path.join(SOURCE_DIR, "deploy", "prometheus", "rules")
TARGET_LABELS = {"job", "instance"}
NAME_RE = re.compile(r"\b(ridgeserve_[a-zA-Z0-9_]*|[a-z_]+:ridgeserve_[a-zA-Z0-9_:]*)")
MATCHERS_RE = re.compile(r"\b(ridgeserve_[a-zA-Z0-9_]*)\{([^}]*)\}")
BY_RE = re.compile(r"\bby\s*\(([^)]*)\)")
# Panels the dashboard must have (issues #5, #14 and #16), by a word of their title.
REQUIRED_PANELS = ["TTFT p50 / p95", "TTFT saved by RidgeFill per second",
                   "TTFT saved per RidgeFill request", "Share of requests using RidgeFill",
                   "TTFT saved per SpecPC request", "SpecPC draft time",
                   "SpecPC dropped prompt tokens", "Share of requests using SpecPC",
                   "SpecKV KV entries kept / dropped", "SpecKV draft time", "SpecKV KV memory kept",
                   "Share of requests using SpecKV", "RidgeFill maps state and version",
                   "RidgeFill calibration progress and map reloads",
                   "RidgeFill online calibration rows per second", "RidgeFill online re-solves",
                   "RidgeFill online last re-solve duration",
                   "RidgeFill online accumulate seconds per second",
                   "RidgeFill shadow KL", "RidgeFill shadow top-1 agreement",
                   "RidgeFill shadow generated-token NLL", "RidgeFill shadows compared / dropped",
                   "tokens per second", "running / waiting", "KV cache", "Preemptions",
                   "Errors by gRPC code"]


def parse_exposition(text):
    """{series name: set of label names} from the text format."""
    types = {}
    labels = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
            expect(m is not None, f"unparsable exposition line {line!r}")
            names = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            labels.setdefault(m.group(1), set()).update(names)
    for name, kind in types.items():
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                expect(name + suffix in labels, f"histogram {name} has no {suffix} series")
    return labels


def check_expr(expr, series, where, recorded=frozenset()):
    names = set(NAME_RE.findall(expr))
    expect(names, f"{where}: no ridgeserve metric in {expr!r}")
    known_labels = set(TARGET_LABELS)
    for name in names:
        if ":" in name:
            expect(name in recorded, f"{where}: recording rule {name} is not defined")
            continue
        expect(name in series, f"{where}: {name} is not exposed by ridgeserve")
        known_labels |= series[name]
    for name, body in MATCHERS_RE.findall(expr):
        for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body):
            expect(label in series.get(name, set()) | TARGET_LABELS,
                   f"{where}: {name} has no label {label}")
    for group in BY_RE.findall(expr):
        for label in (x.strip() for x in group.split(",")):
            expect(label in known_labels, f"{where}: by ({label}) is on none of {sorted(names)}")


def scrape_with_shadow_series(srv):
    """The exposition text once the shadow series by split layer are there (sampling on, at 0
    from the scrape after the maps are loaded)."""
    url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        if "ridgeserve_ridgefill_shadow_samples_total{" in text:
            return url, text
        expect(time.monotonic() < deadline, "no shadow series by split layer after 30 s")
        time.sleep(0.2)


def main():
    checks = Checks("check_dashboard")
    expect(os.path.exists(MAPS), f"RidgeFill maps {MAPS} not found (made by `make test`)")
    online_dir = tempfile.mkdtemp(prefix="rs_dashboard_online_")
    with Server(f"--ridgefill_maps={MAPS}", "--ridgefill_shadow_fraction=1",
                "--ridgefill_online_calibration", f"--ridgefill_online_dir={online_dir}",
                name="dashboard") as srv:
        url, text = scrape_with_shadow_series(srv)
    shutil.rmtree(online_dir, ignore_errors=True)
    series = parse_exposition(text)
    print(f"scraped {len(series)} series names from {url}")
    with open(DASHBOARD, encoding="utf-8") as f:
        dash = json.load(f)

    def importable():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        expect(variables.get("datasource", {}).get("type") == "datasource",
               "no `datasource` template variable of type datasource")
        expect(variables["datasource"].get("query") == "prometheus", "datasource is not Prometheus")
        expect(dash.get("id") is None, "dashboard id must be null to import as a new dashboard")
        for p in dash["panels"]:
            expect(p["datasource"].get("uid") == "${datasource}",
                   f"panel {p['title']!r} does not use the datasource variable")
            for t in p["targets"]:
                expect(t["datasource"].get("uid") == "${datasource}",
                       f"panel {p['title']!r} target {t['refId']} does not use the variable")
        titles = [p["title"] for p in dash["panels"]]
        for want in REQUIRED_PANELS:
            expect(any(want in t for t in titles), f"no panel about {want!r} in {titles}")
        ids = [p["id"] for p in dash["panels"]]
        expect(len(set(ids)) == len(ids), f"duplicate panel ids {ids}")

    def panel_queries():
        n = 0
        for p in dash["panels"]:
            expect(p["targets"], f"panel {p['title']!r} has no query")
            for t in p["targets"]:
                check_expr(t["expr"], series, f"panel {p['title']!r} {t['refId']}")
                n += 1
        print(f"{n} panel queries checked")

    def rule_queries():
        groups = []
        for name in sorted(os.listdir(RULES_DIR)):
            with open(os.path.join(RULES_DIR, name), encoding="utf-8") as f:
                groups += yaml.safe_load(f)["groups"]
        rules = [r for g in groups for r in g["rules"]]
        recorded = {r["record"] for r in rules if "record" in r}
        for r in rules:
            where = r.get("record") or r.get("alert")
            if re.search(r"\bup\{", r["expr"]):
                continue  # Prometheus' own scrape health, not a ridgeserve metric
            check_expr(r["expr"], series, where, recorded)
        print(f"{len(rules)} rules checked")

    checks.run("dashboard importable", importable)
    checks.run("panel queries use exposed metrics", panel_queries)
    checks.run("rule queries use exposed metrics", rule_queries)
    checks.finish()


if __name__ == "__main__":
    main()
