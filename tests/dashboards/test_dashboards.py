"""Dashboards as code: committed JSON up to date, Grafana's types, datasource uids as provisioned, and
every panel target through the project's own runner (Grafana's documented macros and variable formats,
dashboards/templating.py) on real data: Prometheus scraping the twin, OpenSearch for the logs panels."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from anomaly.queries import Queries
from dashboards import build, catalog, model, researcher, verify
from dashboards.cli import cli
from dashboards.templating import Selected, interpolate
from dashboards.viewer import data as viewer_data
from fleetsight.dcgm import names_of
from fleetsight.prometheus import Prometheus
from fleetsight.settings import REPO_ROOT, Settings
from support import StackEnv, free_port_base, wait_until

METRIC = re.compile(r"\b(DCGM_F[A-Z_]+|fleetsight_[a-z0-9_]+|ALERTS|up)\b")
LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# Where the code that publishes a series lives, for series that appear only when something happens
# (alerts, straggler flags, health states, Lustre server jobstats).
PUBLISHERS = ("rules", "anomaly", "health", "exporters", "checks", "fleet")
# Series that only the live health and anomaly services write: a backfill cannot hold them, so their
# panels are checked here, on a stack that runs both services. The straggler flags are left out: they
# show only while a straggler is flagged (the history check covers them).
LIVE_SERVICE_SERIES = re.compile(r"\bfleetsight_(node_health_\w+|straggler_score)\b")
# Scrape jobs of those services (health/component.py, anomaly/component.py).
LIVE_SERVICE_JOBS = ("fleetsight-health", "anomaly")
# Test-only components (FLEETSIGHT_COMPONENT_PATH): the stack's anomaly service with a 5 s cycle.
TEST_COMPONENTS = Path(__file__).with_name("components")
QUICK_ANOMALY = "anomaly-quick-cycle"  # tests/dashboards/components/dashboards_quick_anomaly


def test_committed_json_is_what_the_catalogue_builds() -> None:
    assert build.stale() == [], "run `fleetsight dashboards build` and commit the result"


def test_every_dashboard_type_checks_against_grafana_schema() -> None:
    ok, output = verify.typecheck(Settings())
    assert ok, output


def test_a_schema_error_is_caught(tmp_path: Path) -> None:
    """The type check can fail: a panel with a misspelt key is refused."""
    for spec in catalog.DASHBOARDS:
        (tmp_path / build.path_of(spec).name).write_text(build.render(spec))
    broken = tmp_path / build.path_of(researcher.MY_JOB).name
    broken.write_text(broken.read_text().replace('"gridPos"', '"gridPosition"', 1))
    ok, output = verify.typecheck(Settings(), out_dir=tmp_path)
    assert not ok and "gridPosition" in output


def metrics_of(expr: str) -> set[str]:
    """Metric names an expression reads; the label lists of its grouping and matching clauses are not
    read series (a pod label dcgm-exporter publishes, fleetsight_io_expert_routing, is one)."""
    return set(METRIC.findall(LABEL_LIST.sub("", expr)))


def aliased_away(names: set[str], produced: set[str]) -> set[str]:
    """Names to look for no further: a DCGM field read under all its names ({__name__=~"A|B"}) is
    produced when the stack publishes it under one of them (fleetsight/dcgm.py ALIASES)."""
    return {name for name in names if set(names_of(name)) - {name} & produced}


def used_metrics() -> set[str]:
    return {m for spec in catalog.DASHBOARDS for panel in spec.panels() for q in panel.queries
            if q.datasource == model.PROMETHEUS for m in metrics_of(q.expr)}  # fmt: skip


@pytest.fixture(scope="module")
def live_metric_names(stack_env_module: StackEnv) -> set[str]:
    """Metric names a Prometheus scraping the twin, the node agents, the fabric exporter and the health
    and anomaly services holds. The anomaly service is the stack's own with a 5 s cycle instead of 30 s
    (its test component says why); Prometheus scrapes it as job "anomaly", as it scrapes the stock one."""
    stack = stack_env_module
    stack.env["FLEETSIGHT_COMPONENT_PATH"] = str(TEST_COMPONENTS)
    stack.cli("up", "twin", "exporter-node", "exporter-fabric", "prometheus", "health", QUICK_ANOMALY)
    url = stack.url("prometheus")

    def names() -> set[str] | None:
        found = set(httpx.get(f"{url}/api/v1/label/__name__/values").json()["data"])
        # Two scrapes of every node's agent, so that rates over a minute have their two points.
        query = (
            'count(count by (node) (count_over_time(fleetsight_collector_success{job="fleetsight-node"}[1m])'
            " >= 2)) "
            ">= count(count by (node) (DCGM_FI_DEV_POWER_USAGE))"
        )
        rated = httpx.get(f"{url}/api/v1/query", params={"query": query}).json()["data"]["result"]
        wanted = {"DCGM_FI_DEV_POWER_USAGE", "fleetsight_bmc_psu_healthy", "fleetsight_fabric_port_up"}
        return found if wanted <= found and rated else None

    return wait_until(names, timeout=120, what="the stack's series in Prometheus")


def test_every_metric_a_panel_uses_exists(live_metric_names: set[str]) -> None:
    """Catches a misspelt metric: each name is scraped from the stack, or named by the service that
    publishes it (alerts, straggler flags, health states appear only when those fire)."""
    sources = [
        path.read_text()
        for folder in PUBLISHERS
        for pattern in ("*.py", "*.yml")
        for path in (REPO_ROOT / folder).rglob(pattern)
    ]
    missing = [
        name
        for name in sorted(
            used_metrics() - live_metric_names - aliased_away(used_metrics(), live_metric_names)
        )
        if name != "ALERTS"
        and not any(re.search(rf"\b{name.removesuffix('_total')}\b", text) for text in sources)
    ]
    assert not missing, f"panels use metrics nobody publishes: {missing}"


def rule_expressions() -> dict[str, str]:
    """Every alert and recording rule's expression in rules/*.yml, by rule name."""
    exprs = {}
    for path in (REPO_ROOT / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            for rule in group.get("rules", []):
                exprs[f"{path.name}:{rule.get('alert') or rule.get('record')}"] = rule["expr"]
    return exprs


def recorded_names() -> set[str]:
    return {
        rule["record"]
        for path in (REPO_ROOT / "rules").glob("*.yml")
        for group in yaml.safe_load(path.read_text()).get("groups", [])
        for rule in group.get("rules", [])
        if "record" in rule
    }


def health_queries() -> dict[str, str]:
    """The PromQL the health service sends (its ``self.query("...")`` calls)."""
    tree = ast.parse((REPO_ROOT / "health" / "sources.py").read_text())
    return {
        f"health/sources.py:{node.lineno}": node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "query"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def consumer_queries() -> dict[str, str]:
    """Where each PromQL that a rule, the anomaly service or the health service runs comes from."""
    queries = Queries()
    anomaly = {f"anomaly:{k}": v for k, v in {**queries.gpu_fields(), **queries.node_fields()}.items()}
    return {**rule_expressions(), **anomaly, **health_queries()}


RECORDED_NAME = re.compile(r"\b[a-zA-Z_]\w*:[\w:]+")  # level:metric:operations
RANGE_OR_SUBQUERY = re.compile(r"\[[^\]]*\]")  # [5m], [30s:5s]: their colons are not names


def unproduced(queries: dict[str, str], recorded: set[str], produced: set[str], code: list[str]) -> list[str]:
    """``where: metric`` for each series a query reads that no recording rule records, no scrape holds
    and no service's code publishes."""
    missing = []
    for where, expr in queries.items():
        expr = RANGE_OR_SUBQUERY.sub("", expr)
        missing += [f"{where}: {name}" for name in sorted(set(RECORDED_NAME.findall(expr)) - recorded)]
        names = metrics_of(RECORDED_NAME.sub("", expr))
        for name in sorted(names - produced - aliased_away(names, produced) - {"ALERTS"}):
            stem = name.removesuffix("_total")
            if not any(re.search(rf"\b{stem}\b", text) for text in code):
                missing.append(f"{where}: {name}")
    return missing


def test_every_metric_the_rules_and_services_read_is_produced(live_metric_names: set[str]) -> None:
    """The rules, the anomaly service and the health service read only series that the stack scrapes,
    a recording rule records, or a service's code publishes (flags and alerts appear only when they
    fire). Rule files are not publishers: a misspelt name there would otherwise vouch for itself."""
    code = [path.read_text() for folder in PUBLISHERS for path in (REPO_ROOT / folder).rglob("*.py")]
    queries = consumer_queries()
    assert len(queries) > 40 and health_queries(), "the consumers' queries were not found"
    recorded = recorded_names()
    assert not unproduced(queries, recorded, live_metric_names, code)
    # the check can fail: a misspelt metric, or a misspelt recorded series, in a rule is named
    typo = {"gpu.yml:typo": "DCGM_FI_DEV_POWER_USAGEE > 0 and node:dcgm_power_usage_watt:sum > 0"}
    assert unproduced(typo, recorded, live_metric_names, code) == [
        "gpu.yml:typo: node:dcgm_power_usage_watt:sum",
        "gpu.yml:typo: DCGM_FI_DEV_POWER_USAGEE",
    ]


def shows_on_a_healthy_twin(panel: model.Panel) -> bool:
    """Panels over series that always exist, without a filter that keeps only faults."""
    return not panel.needs and all(
        q.datasource == model.PROMETHEUS and not re.search(r"==|>|ALERTS", q.expr) for q in panel.queries
    )


def label_values(url: str, series: str, label: str) -> list[str] | None:
    """Grafana's label_values(series, label), or None while nothing has it yet: a recorded series
    such as node:hpc_job:current appears only once the anomaly service has been scraped and the rule
    group has evaluated after that."""
    found = httpx.get(f"{url}/api/v1/label/{label}/values", params={"match[]": series}).json()["data"]
    return found or None


def test_every_query_runs_and_the_variables_resolve(
    stack_env_module: StackEnv, live_metric_names: set[str]
) -> None:
    url = stack_env_module.url("prometheus")
    values: dict[str, str] = {}
    every_cluster = {
        "cluster": verify.variable_values(json.loads(build.render(catalog.DASHBOARDS[0])), {})["cluster"]
    }
    for spec in catalog.DASHBOARDS:
        for variable in spec.variables:
            if variable.constant:
                values[variable.name] = variable.query
                continue
            if variable.name == "cluster":  # at All (.*): the twin's Prometheus read directly
                continue
            label = re.fullmatch(r"label_values\((.+), (\w+)\)", variable.query)
            assert label, variable.query
            selector = interpolate(label.group(1), every_cluster)
            values[variable.name] = wait_until(
                partial(label_values, url, selector, label.group(2)),
                timeout=90,
                what=f"{spec.uid}: variable ${variable.name} to resolve",
            )[0]
    results = verify.run_queries(url, values, time.time(), range_s=600)
    refused = [(r.panel, r.error) for r in results if r.error]
    assert not refused
    with_data = {r.panel for r in results if r.series}
    always = [
        panel.title
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        if shows_on_a_healthy_twin(panel)
    ]
    assert always and set(always) <= with_data, f"empty on a running twin: {set(always) - with_data}"


def health_scraped_by(url: str) -> float | None:
    """An instant ten seconds ago at which Prometheus already held the health service's node states,
    or None while it did not."""
    at = time.time() - 10
    with Prometheus(url) as prometheus:
        return at if prometheus.query("count(fleetsight_node_health_state == 1)", at) else None


def without_cluster_filter(folder: Path) -> Path:
    """Copies of the committed dashboards with the cluster matcher taken out of every query."""
    for path in verify.dashboard_files():
        text = (
            path.read_text().replace('cluster=~\\"$cluster\\", ', "").replace('{cluster=~\\"$cluster\\"}', "")
        )
        (folder / path.name).write_text(text)
    return folder


def test_all_clusters_shows_the_same_numbers_on_a_single_cluster_stack(
    stack_env_module: StackEnv, live_metric_names: set[str], tmp_path: Path
) -> None:
    """The twin's Prometheus read directly (its series carry no external label, only some targets a
    `cluster` label): with the variable at All (`.*`, which matches a missing label too) every panel
    returns the same series as its query without the filter, evaluated at the same instant."""
    url = stack_env_module.url("prometheus")
    nodes = label_values(url, "DCGM_FI_DEV_POWER_USAGE", "node")
    assert nodes
    # The panels that need the health service count only once it has been scraped by the chosen
    # instant: on a loaded machine its first scrape can come after the twin's series.
    at = wait_until(
        partial(health_scraped_by, url), timeout=90, what="the health service's states in Prometheus"
    )
    values = {"node": nodes[0], "hpc_job": "none"}

    def series(folder: Path) -> dict[tuple[str, str], list[int]]:
        found: dict[tuple[str, str], list[int]] = {}
        for r in verify.run_queries(url, values, at, range_s=600, folder=folder):
            assert not r.error, r
            found.setdefault((r.dashboard, r.panel), []).append(r.series)
        return found

    filtered, plain = series(build.OUTPUT_DIR), series(without_cluster_filter(tmp_path))
    assert filtered == plain
    assert sum(n for counts in filtered.values() for n in counts) > 20, filtered


# ------------------------------------------------- datasources, broken panels, variables, logs panels
COMPOSE_DATASOURCES = REPO_ROOT / "dashboards" / "compose" / "datasources"


def test_every_target_names_a_provisioned_datasource_of_its_type() -> None:
    """The uid (and type) of every panel and target of the committed JSON is a datasource the provisioning
    files declare, in both sets (the shared one and compose's own logs file): else Grafana shows the panel
    broken."""
    shared = verify.datasources()
    compose = {**shared, **verify.datasources(COMPOSE_DATASOURCES)}
    used = []
    for path in verify.dashboard_files():
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            refs = [panel.get("datasource"), *(t.get("datasource") for t in panel.get("targets", []))]
            used += [(path.name, panel["title"], ref) for ref in refs if ref]
        used += [
            (path.name, v["name"], v["datasource"])
            for v in dashboard.get("templating", {}).get("list", [])
            if "datasource" in v
        ]
    assert {ref["uid"] for _, _, ref in used} == {model.PROMETHEUS, model.LOGS}
    for sources in (shared, compose):
        wrong = [(f, p, ref) for f, p, ref in used if sources.get(ref["uid"], {}).get("type") != ref["type"]]
        assert not wrong, wrong


def break_node_dashboard(folder: Path) -> list[str]:
    """Copies of the committed dashboards, three panels of node.json broken (a metric nobody publishes, a
    datasource uid nobody provisions, a PromQL syntax error); the broken panels' titles."""
    for path in verify.dashboard_files():
        shutil.copy(path, folder / path.name)
    path = folder / "node.json"
    dashboard = json.loads(path.read_text())
    panels = [p for p in dashboard["panels"] if p.get("type") != "row" and p.get("targets")][:3]
    panels[0]["targets"][0]["expr"] = 'fleetsight_no_such_metric_total{node="$node"}'
    for part in [panels[1], *panels[1]["targets"]]:
        part["datasource"] = {"type": "prometheus", "uid": "no-such-datasource"}
    panels[2]["targets"][0]["expr"] = "sum(rate(DCGM_FI_DEV_POWER_USAGE[5m])"
    path.write_text(json.dumps(dashboard, indent=2))
    return [panel["title"] for panel in panels]


def test_a_broken_panel_is_reported_naming_dashboard_and_panel(
    stack_env_module: StackEnv, live_metric_names: set[str], tmp_path: Path
) -> None:
    """`dashboards verify --dir` on a copy with three broken panels: it exits 1, names the dashboard and
    panel of the unprovisioned uid and of the syntax error, lists the unknown metric's panel as empty, and
    reports nothing else of the copy as refused."""
    wrong_metric, wrong_uid, bad_syntax = break_node_dashboard(tmp_path)
    prometheus = stack_env_module.url("prometheus")
    command = ["verify", "--dir", str(tmp_path), "--prometheus", prometheus, "--window", "600", "--no-types"]
    result = CliRunner().invoke(cli, command)
    print(result.output)
    assert result.exit_code == 1, result.output
    refused = [line for line in result.output.splitlines() if line.startswith("REFUSED ")]
    node = "REFUSED fleetsight-node / "
    assert any(line.startswith(f"{node}{wrong_uid}: datasource uid 'no-such-datasource'") for line in refused)
    assert any(line.startswith(f"{node}{bad_syntax}: ") and "parse error" in line for line in refused)
    assert len(refused) == 2, refused
    assert f"empty   fleetsight-node / {wrong_metric}" in result.output.splitlines()


def test_a_multi_value_variable_is_sent_as_grafana_escapes_it(
    stack_env_module: StackEnv, live_metric_names: set[str]
) -> None:
    """A multi-value `$node` through the runner to the real Prometheus: `(a|b)` of regex-escaped values
    parses, and a value with a regex metacharacter matches only itself (`n000.` is not a wildcard)."""
    url = stack_env_module.url("prometheus")
    nodes = sorted(httpx.get(f"{url}/api/v1/label/node/values",
                             params={"match[]": "DCGM_FI_DEV_POWER_USAGE"}).json()["data"])  # fmt: skip
    assert len(nodes) >= 2, nodes
    chosen = Selected((nodes[0], nodes[1][:-1] + "."), multi=True)
    expr = interpolate('count by (node) (DCGM_FI_DEV_POWER_USAGE{node=~"$node"})', {"node": chosen})
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}).json()
    assert answer["status"] == "success", answer
    assert {series["metric"]["node"] for series in answer["data"]["result"]} == {nodes[0]}


@pytest.fixture
def opensearch_url() -> Iterator[str]:
    """OpenSearch in a stack of its own (`up` adds nothing to a running stack), its run folder outside
    pytest's 0700 tmp folder: OpenSearch runs as nobody when the tests run as root."""
    base = Path(tempfile.mkdtemp(prefix="fleetsight-dashboards-logs-"))
    base.chmod(0o755)
    port_base = free_port_base()
    env = {**os.environ, "FLEETSIGHT_RUN_DIR": str(base / "run"), "FLEETSIGHT_PORT_BASE": str(port_base)}
    stack = StackEnv(base / "run", port_base, env)
    try:
        stack.cli("up", "opensearch")
        yield stack.url("opensearch")
    finally:
        stack.cli("down", "--timeout", "20", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_the_logs_panels_run_against_opensearch(
    stack_env_module: StackEnv, live_metric_names: set[str], opensearch_url: str
) -> None:
    """The researcher's step-time and loss panels, their Lucene query with `$hpc_job` expanded and the
    date histogram the Elasticsearch datasource sends, against the real OpenSearch: a training-progress
    document of the job is found; another job's panel stays empty."""
    logs = opensearch_url
    document = {
        "@timestamp": datetime.now(UTC).isoformat(),
        "fleetsight": {"hpc_job": "4242", "cluster": "demo"},
        "event": {"action": "training_progress"},
        "training": {"step_time_ms": 812.5, "loss": 1.93},
    }
    indexed = httpx.post(f"{logs}/fleetsight-logs-app-test/_doc", params={"refresh": "true"}, json=document)
    assert indexed.is_success, indexed.text
    prometheus = stack_env_module.url("prometheus")

    def logs_panels(job: str, cluster: str | None = None) -> dict[str, int]:
        chosen = {"hpc_job": job, **({"cluster": cluster} if cluster else {})}
        results = verify.run_queries(prometheus, chosen, time.time(), 600, logs)
        found = {r.panel: r.series for r in results if r.datasource == model.LOGS}
        assert not [r.error for r in results if r.datasource == model.LOGS and r.error]
        return found

    assert logs_panels("4242") == {"Step time": 1, "Loss": 1}
    assert logs_panels("4243") == {"Step time": 0, "Loss": 0}
    # the cluster variable filters the documents too (fleetsight.cluster): All, the cluster, another
    assert logs_panels("4242", "demo") == {"Step time": 1, "Loss": 1}
    assert logs_panels("4242", "other") == {"Step time": 0, "Loss": 0}
    # The local viewer (dashboards/viewer/) draws the same search: the document's step time in a bucket.
    my_job = json.loads((build.OUTPUT_DIR / "my-job.json").read_text())
    step_time = next(p for p in my_job["panels"] if p.get("title") == "Step time")
    end = time.time()
    with Prometheus(prometheus) as client, httpx.Client(base_url=logs, timeout=30) as search:
        runner = verify.Runner(client, search, end - 600, end)
        drawn = viewer_data.panel_data(runner, my_job, step_time, {"hpc_job": "4242"})
    assert [q["error"] for q in drawn["queries"]] == [""]
    assert [v for f in drawn["frames"] for _, v in f["points"] if v is not None] == [812.5]


# ------------------------------------------------- the live health and anomaly services' panels
# Last in the module: the straggler score waits on the twin's job leaving its start-up (real time), and
# the tests above (OpenSearch's start above all) run meanwhile instead of before it.


def live_service_panels() -> list[model.Panel]:
    """Panels that read what only the live health or anomaly service writes."""
    return [
        panel
        for spec in catalog.DASHBOARDS
        for panel in spec.panels()
        if any(LIVE_SERVICE_SERIES.search(q.expr) for q in panel.queries)
    ]


def test_the_health_and_straggler_panels_show_the_live_services(
    stack_env_module: StackEnv, live_metric_names: set[str]
) -> None:
    """Nodes by health state, availability and the straggler score: once Prometheus has scraped the
    health and anomaly services, each of their panels returns data (not only: the metric exists)."""
    url = stack_env_module.url("prometheus")
    panels = {panel.title for panel in live_service_panels()}
    assert {"Nodes by health state", "Availability (share of node-hours fit for work)"} <= panels
    assert "Straggler score per node" in panels

    def scraped() -> bool:
        query = " or ".join(f'up{{job="{job}"}} == 1' for job in LIVE_SERVICE_JOBS)
        answer = httpx.get(f"{url}/api/v1/query", params={"query": query}).json()["data"]["result"]
        return {series["metric"]["job"] for series in answer} == set(LIVE_SERVICE_JOBS)

    wait_until(scraped, timeout=120, interval=1, what=f"Prometheus's first scrape of {LIVE_SERVICE_JOBS}")
    job = httpx.get(f"{url}/api/v1/label/hpc_job/values",
                    params={"match[]": "DCGM_FI_DEV_POWER_USAGE"}).json()["data"]  # fmt: skip
    assert job, "no job runs on the twin"
    values = {"hpc_job": job[0]}

    def empty() -> set[str]:
        results = verify.run_queries(url, values, time.time(), range_s=600)
        refused = [(r.panel, r.error) for r in results if r.error and r.panel in panels]
        assert not refused, refused
        return panels - {r.panel for r in results if r.series}

    # The anomaly service scores a job two cycles (5 s each here) after the twin's job has left its 90 s
    # start-up (the recorded 30 s window must be busy first), and the availability subquery samples
    # every $__interval (1 m): about two minutes after the twin started.
    deadline = time.monotonic() + 300
    while (missing := empty()) and time.monotonic() < deadline:
        time.sleep(2)  # polling interval, not synchronisation: the deadline bounds the wait
    # The anomaly service says why it scores nothing: its source's last error.
    anomaly = httpx.get(stack_env_module.url("anomaly", "/v1/stragglers")).json()["status"]
    assert not missing, f"empty with both services scraped: {missing}; anomaly service: {anomaly}"
