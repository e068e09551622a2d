"""The dashboards' cluster variable and the viewer's fleet page, on real servers: two clusters' Prometheus
(each with its `cluster` external label, scraping a small real exporter of dcgm-exporter's exposition
format and evaluating a real alert rule) and Thanos sidecars under one Thanos Query, the real global layer
(`fleetsight fleet serve`, fleet/api.py) over cluster a's real health service, cluster b's health service
down (its port closed) and a cluster c that has neither, and the viewer (`fleetsight dashboards serve`)
reading that Thanos Query, with and without `--fleet-url`, in Debian's Chromium.

Checked: every dashboard has the variable (All = `.*`) and every selector of every query filters on it;
through Thanos the variable lists both clusters, a query filtered on one returns only that cluster's
series, and All returns what the queries without the filter return; the fleet page's banner names the
clusters the view is missing (b's health service, c's health and metrics) while a's row shows its node
states and both clusters' GPUs and firing alerts; without a global layer the page says so.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from browser import console_errors, headless_chromium
from dashboards import build, catalog, clusters, model, verify
from dashboards.templating import ALL, Selected
from fleetsight.prometheus import Prometheus
from fleetsight.settings import REPO_ROOT
from health.component import serve_command
from support import FLEETSIGHT, Process, prometheus_with_sidecar, quiet_ports, thanos_binary, wait_until

SCRAPE_S = 1
# Each cluster's GPUs (node -> GPU temperatures): a has one GPU over the alert's 90 °C, b has none; both
# have a node dgx-017 (names may repeat across clusters).
GPUS = {"a": {"a-n001": [45, 93], "dgx-017": [50]}, "b": {"b-n001": [40, 41, 42], "dgx-017": [44]}}
HOT_RULE = {
    "alert": "GPUTooHotForTheTest",
    "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
    "labels": {"severity": "warning"},
}
A_NODES = ["a-n001", "a-n002", "dgx-017"]  # cluster a's health service's nodes


def exposition(cluster: str) -> str:
    """What dcgm-exporter serves for the cluster's GPUs (its real metric names and labels)."""
    lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).", "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
    power = ["# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
    for node, temps in GPUS[cluster].items():
        for gpu, temp in enumerate(temps):
            labels = f'gpu="{gpu}",UUID="GPU-{cluster}-{node}-{gpu}",Hostname="{node}",node="{node}"'
            lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {temp}")
            power.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {300 + temp}")
    return "\n".join([*lines, *power, ""])


def exporter(port: int, cluster: str) -> ThreadingHTTPServer:
    body = exposition(cluster).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cluster_metrics(folder: Path, name: str, ports: Iterator[int]) -> tuple[list[Process], int]:
    """The cluster's Prometheus (its external label, the exporter, the rule) and its Thanos sidecar, and
    the sidecar's gRPC port."""
    folder.mkdir()
    prometheus_port, exporter_port, grpc, http = next(ports), next(ports), next(ports), next(ports)
    (folder / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "test", "rules": [HOT_RULE]}]}))
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_S}s",
            "evaluation_interval": f"{SCRAPE_S}s",
            "external_labels": {"cluster": name, "replica": "A"},
        },
        "rule_files": [str(folder / "rules.yml")],
        "scrape_configs": [
            {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}]},
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    exporter(exporter_port, name)
    prometheus, sidecar = prometheus_with_sidecar(name, folder, prometheus_port, grpc, http)
    return [prometheus, sidecar], grpc


def health_a(folder: Path, port: int) -> Process:
    """Cluster a's real health service (its nodes from a file, no Prometheus: every node healthy)."""
    folder.mkdir()
    (folder / "nodes.txt").write_text("\n".join(A_NODES) + "\n")
    env = {**os.environ, "FLEETSIGHT_CLUSTER": "a"}
    command = serve_command(
        f"127.0.0.1:{port}", folder / "state", policy=REPO_ROOT / "health" / "policy.yml",
        extra=("--nodes-file", str(folder / "nodes.txt"), "--no-breaker-alert"),
    )  # fmt: skip
    process = Process("health-a", command, folder / "health.log", env)
    process.wait_ready(f"http://127.0.0.1:{port}/-/ready", timeout=60)
    return process


def viewer(folder: Path, name: str, port: int, thanos_query: str, fleet_url: str | None) -> Process:
    command = [
        *FLEETSIGHT,
        "dashboards",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--prometheus",
        thanos_query,
        *(["--fleet-url", fleet_url] if fleet_url else []),
    ]  # fmt: skip  (no --logs: the global view has no OpenSearch)
    process = Process(name, command, folder / f"{name}.log")
    process.wait_ready(f"http://127.0.0.1:{port}/healthz")
    return process


@dataclass
class World:
    query: str  # the Thanos Query over both clusters
    layer: str  # the global layer
    viewer: str  # the viewer with --fleet-url
    bare_viewer: str  # the viewer without it


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("clusters")
    ports = iter(quiet_ports(20))  # every server's port chosen at once: none can take another's
    processes: list[Process] = []
    try:
        grpc_ports = []
        for name in GPUS:
            started, grpc = cluster_metrics(root / name, name, ports)
            processes += started
            grpc_ports.append(grpc)
        query_port = next(ports)
        processes.append(Process(
            "thanos-query",
            [
                thanos_binary(), "query", f"--http-address=127.0.0.1:{query_port}",
                f"--grpc-address=127.0.0.1:{next(ports)}", "--query.replica-label=replica",
                *(f"--endpoint=127.0.0.1:{port}" for port in grpc_ports),
            ],
            root / "query.log",
        ))  # fmt: skip
        query = f"http://127.0.0.1:{query_port}"
        processes[-1].wait_ready(f"{query}/-/ready")
        a_port = next(ports)
        processes.append(health_a(root / "health-a", a_port))
        entries = [
            {"name": "a", "health": f"http://127.0.0.1:{a_port}"},
            {"name": "b", "health": f"http://127.0.0.1:{next(ports)}"},  # closed: b's health service is down
            {"name": "c", "health": f"http://127.0.0.1:{next(ports)}"},  # closed, and no metrics store
        ]
        (root / "clusters.yml").write_text(yaml.safe_dump({"clusters": entries}))
        layer_port = next(ports)
        processes.append(Process(
            "fleet",
            [
                *FLEETSIGHT, "fleet", "serve", "--clusters-file", str(root / "clusters.yml"),
                "--listen", f"127.0.0.1:{layer_port}", "--timeout", "2s", "--poll-interval", "1s",
                "--thanos-url", query,
            ],
            root / "fleet.log",
        ))  # fmt: skip
        layer = f"http://127.0.0.1:{layer_port}"
        processes[-1].wait_ready(f"{layer}/-/ready")
        viewer_port, bare_port = next(ports), next(ports)
        processes.append(viewer(root, "viewer", viewer_port, query, layer))
        processes.append(viewer(root, "viewer-bare", bare_port, query, None))
        # both clusters' GPUs and a's alert, through the global query (the sidecars join within seconds)
        wait_until(
            lambda: firing_by_cluster(query) == {"a": 1.0} and gpus_by_cluster(query) == {"a": 3, "b": 4},
            timeout=90,
            what="both clusters' GPUs and a's alert through Thanos Query",
        )
        # range queries too (the panels' own): a sidecar answers them once it has read its Prometheus's
        # time range, some seconds after its first instant answers
        wait_until(
            lambda: ranged_clusters(query) == {"a", "b"}, timeout=90, what="range queries through Thanos"
        )
        yield World(query, layer, f"http://127.0.0.1:{viewer_port}", f"http://127.0.0.1:{bare_port}")
    finally:
        for process in reversed(processes):
            process.stop()


def instant(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def ranged_clusters(url: str) -> set[str]:
    end = time.time() - 5  # as the test that compares the panels asks
    params = {"query": "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)", "start": end - 300, "end": end, "step": 5}
    answer = httpx.get(f"{url}/api/v1/query_range", params=params, timeout=30).json()
    return {s["metric"].get("cluster", "") for s in answer.get("data", {}).get("result", [])}


def gpus_by_cluster(url: str) -> dict[str, int]:
    return {
        s["metric"].get("cluster", ""): int(s["value"][1])
        for s in instant(url, "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)")
    }


def firing_by_cluster(url: str) -> dict[str, float]:
    found = instant(url, 'count by (cluster) (ALERTS{alertstate="firing"})')
    return {s["metric"].get("cluster", ""): float(s["value"][1]) for s in found}


# ------------------------------------------------------------------------------- the dashboards' JSON
def committed() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in verify.dashboard_files()}


def test_every_dashboard_has_the_cluster_variable_at_all() -> None:
    for name, dashboard in committed().items():
        first = dashboard["templating"]["list"][0]
        assert first["name"] == "cluster" and first["type"] == "query", name
        assert first["query"] == "label_values(up, cluster)", name
        assert (first["multi"], first["includeAll"], first["allValue"]) == (True, True, ".*"), name
        assert first["current"]["value"] == ALL, name
        for variable in dashboard["templating"]["list"][1:]:
            if variable["type"] == "query":  # the others are restricted to the chosen clusters
                assert '{cluster=~"$cluster"}' in variable["query"], (name, variable["query"])
    assert {spec.uid for spec in catalog.DASHBOARDS} >= {"fleetsight-fleet"}


# A series' name where a selector can start: metric names the dashboards read (the test's own list, not
# the filter's scanner), a recorded name (level:metric:ops), or bare braces.
SELECTOR_NAME = re.compile(r"\b(DCGM_F[A-Z_]+|fleetsight_[a-z0-9_]+|ALERTS|up|[a-z_]+:[a-z_:]+[a-z])\b")


def unfiltered(expr: str) -> list[str]:
    """Each selector of ``expr`` that does not start with the cluster matcher."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr.replace('"$cluster"', "CLUSTER"))  # strings out
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries' steps out
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    filtered = "{cluster=~CLUSTER"
    missing = [m.group(0) for m in SELECTOR_NAME.finditer(text) if not text[m.end() :].startswith(filtered)]
    # every brace left is a selector's (strings are out): each must start with the matcher
    braces = [m.start() for m in re.finditer(r"\{", text)]
    missing += [text[i : i + 40] for i in braces if not text[i:].startswith(filtered)]
    return missing


def test_every_selector_of_every_query_filters_on_the_cluster() -> None:
    problems = []
    for name, dashboard in committed().items():
        for target in verify.targets(dashboard):
            if target.uid == model.LOGS:
                if not target.body["query"].startswith(clusters.LUCENE + " AND "):
                    problems.append((name, target.panel, target.body["query"]))
                continue
            if bad := unfiltered(target.body["expr"]):
                problems.append((name, target.panel, bad))
    assert not problems
    # the check can fail: a selector without the matcher, bare or with braces, is named
    assert unfiltered('sum(up{cluster=~"$cluster"}) / count(DCGM_FI_DEV_GPU_TEMP{node="x"})') == [
        "DCGM_FI_DEV_GPU_TEMP",
        '{node=""})',
    ]
    assert unfiltered('max without (__name__) ({__name__=~"a|b"})') != []


def test_the_filter_leaves_functions_label_lists_strings_and_variables_alone() -> None:
    found = clusters.on_cluster(
        'sum by (node) (rate(x_total{a="{b}"}[$__rate_interval])) and on (node) '
        'label_replace(y, "n", "$1", "m", "(.*)") * $price_per_kwh'
    )
    assert found == (
        'sum by (node) (rate(x_total{cluster=~"$cluster", a="{b}"}[$__rate_interval])) and on (node) '
        'label_replace(y{cluster=~"$cluster"}, "n", "$1", "m", "(.*)") * $price_per_kwh'
    )
    assert clusters.on_cluster('up{cluster="a"}') == 'up{cluster="a"}'


# --------------------------------------------------------------------- through Thanos, two clusters
def test_up_through_thanos_carries_each_clusters_label(world: World) -> None:
    """What the variable's query relies on: through Thanos Query every series, `up` included, has its
    cluster's external label (a Prometheus read directly has it only where the target sets it)."""
    found = instant(world.query, "up")
    assert {s["metric"].get("cluster") for s in found} == {"a", "b"}, found
    assert all("cluster" in s["metric"] for s in found)


def runner(world: World) -> tuple[Prometheus, verify.Runner]:
    prometheus = Prometheus(world.query, timeout=30, post_over=0)
    end = time.time()
    return prometheus, verify.Runner(prometheus, None, end - 300, end)


def fleet_dashboard() -> dict[str, Any]:
    return json.loads((build.OUTPUT_DIR / "fleet.json").read_text())


def panel_target(dashboard: dict[str, Any], title: str) -> verify.Target:
    return next(t for t in verify.targets(dashboard) if t.panel == title)


def test_the_variable_lists_the_clusters_and_a_filtered_query_returns_only_one(world: World) -> None:
    dashboard = fleet_dashboard()
    gpus = panel_target(dashboard, "GPUs reporting, by cluster")
    prometheus, run = runner(world)
    with prometheus:
        assert sorted(run.prometheus.label_values("cluster", "up")) == ["a", "b"]

        def per_cluster(choice: str | list[str]) -> dict[str, str]:
            values = verify.variable_values(dashboard, {"cluster": choice})
            answer = run.answer(gpus, values)
            assert not answer.error, answer
            return {s["metric"]["cluster"]: s["value"][1] for s in answer.result}

        assert per_cluster([ALL, "a", "b"]) == {"a": "3", "b": "4"}  # All: the custom all value .*
        assert per_cluster("a") == {"a": "3"}
        assert per_cluster("b") == {"b": "4"}
        assert per_cluster(["a", "b"]) == {"a": "3", "b": "4"}  # several: (a|b)
        assert per_cluster("nope") == {}
        # a variable not chosen opens at All, as the dashboard's saved choice says
        assert verify.variable_values(dashboard, {})["cluster"] == Selected(
            (), multi=True, include_all=True, all_selected=True, all_value=".*"
        )


def strip_filter(folder: Path) -> Path:
    """Copies of the committed dashboards without the cluster matcher (the queries as they were)."""
    for path in verify.dashboard_files():
        text = (
            path.read_text().replace('cluster=~\\"$cluster\\", ', "").replace('{cluster=~\\"$cluster\\"}', "")
        )
        (folder / path.name).write_text(text)
    return folder


def series_per_panel(url: str, folder: Path, at: float, values: dict[str, Any]) -> dict[tuple[str, str], int]:
    results = verify.run_queries(url, values, at, range_s=300, folder=folder)
    assert not [r for r in results if r.error], [r for r in results if r.error]
    found: dict[tuple[str, str], int] = {}
    for r in results:
        if not r.skipped:
            found[(r.dashboard, r.panel)] = found.get((r.dashboard, r.panel), 0) + r.series
    return found


def test_all_clusters_answers_what_the_queries_without_the_filter_answer(
    world: World, tmp_path: Path
) -> None:
    at = time.time() - 5
    values = {"node": "dgx-017", "hpc_job": "none"}
    filtered = series_per_panel(world.query, build.OUTPUT_DIR, at, values)
    plain = series_per_panel(world.query, strip_filter(tmp_path), at, values)
    assert filtered == plain
    assert sum(filtered.values()) >= 6, filtered  # GPUs, alerts, up, power: not only empty panels
    one = series_per_panel(world.query, build.OUTPUT_DIR, at, {**values, "cluster": "a"})
    assert one[("fleetsight-node", "GPU temperature")] == 1  # dgx-017 of cluster a only, not b's too
    assert plain[("fleetsight-node", "GPU temperature")] == 2


def test_the_viewer_lists_the_clusters_and_restricts_the_nodes(world: World) -> None:
    def variables(**chosen: str) -> dict[str, dict[str, Any]]:
        params = {"from": "now-5m", **{f"var-{k}": v for k, v in chosen.items()}}
        answer = httpx.get(
            f"{world.viewer}/api/dashboards/fleetsight-node/variables", params=params, timeout=30
        )
        return {v["name"]: v for v in answer.json()["variables"]}

    every = variables()
    assert every["cluster"]["options"] == ["a", "b"]
    assert every["cluster"]["includeAll"] and every["cluster"]["multi"] and every["cluster"]["default"] == ALL
    assert every["node"]["options"] == ["a-n001", "b-n001", "dgx-017"]
    assert variables(cluster="b")["node"]["options"] == ["b-n001", "dgx-017"]
    assert variables(cluster=ALL)["node"]["options"] == ["a-n001", "b-n001", "dgx-017"]


# ------------------------------------------------------------------------------------ the fleet page
def fleet_api_shape(world: World) -> dict[str, Any]:
    """The global layer's own answer, for the page to be compared with."""
    return httpx.get(f"{world.layer}/v1/clusters", timeout=30).json()


def banner(browser: WebDriver) -> list[str]:
    return [g.text for g in browser.find_elements(By.CSS_SELECTOR, "#partial .gap")]


def cluster_rows(browser: WebDriver) -> dict[str, dict[str, str]]:
    rows = {}
    for row in browser.find_elements(By.CSS_SELECTOR, "#clusters tbody tr"):
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        rows[row.get_attribute("data-cluster")] = dict(
            zip(("name", "health", "states", "metrics", "gpus", "firing"), cells, strict=True)
        )
    return rows


def test_the_fleet_page_names_the_missing_clusters_in_a_banner(world: World) -> None:
    layer = fleet_api_shape(world)
    assert [m["cluster"] for m in layer["missing"]] == ["b", "c"], layer
    with headless_chromium() as browser:
        browser.get(world.viewer)
        link = wait_until(
            lambda: browser.find_elements(By.CSS_SELECTOR, "a[href='/fleet']"), timeout=30, what="home"
        )
        link[0].click()
        lines = wait_until(lambda: banner(browser) if len(banner(browser)) == 3 else None, timeout=60,
                           what="the banner naming b and c")  # fmt: skip
        assert lines[0].startswith("Partial view: cluster b is not answering (")
        assert lines[1].startswith("Partial view: cluster c is not answering (")
        assert lines[2] == (
            "Partial view: the metrics of cluster c are not answering (no store with this cluster label)"
        )
        rows = wait_until(lambda: cluster_rows(browser) or None, timeout=30, what="the cluster rows")
        assert list(rows) == ["a", "b", "c"]
        states = layer["clusters"][0]["states"]
        assert sum(states.values()) == len(A_NODES), states
        shown = ", ".join(f"{state} {n}" for state, n in states.items() if n)
        assert rows["a"]["health"].startswith("answers") and rows["a"]["states"] == shown
        assert rows["b"]["health"].startswith("not answering: ") and rows["b"]["states"] == "–"
        assert (rows["a"]["gpus"], rows["a"]["firing"], rows["b"]["gpus"], rows["b"]["firing"]) == (
            "3",
            "1",
            "4",
            "0",
        )
        assert rows["a"]["metrics"] == rows["b"]["metrics"] == "1 of 1 store answering"
        assert rows["c"]["metrics"] == "0 of 0 stores answering"
        # c's metrics are missing: its figures are unknown, not zero GPUs and no alert
        assert (rows["c"]["gpus"], rows["c"]["firing"]) == ("unknown", "unknown")
        alerts = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#alerts tbody tr")]
        assert len(alerts) == 1 and alerts[0].startswith("a GPUTooHotForTheTest warning a-n001"), alerts
        assert browser.find_element(By.ID, "not-configured").is_displayed() is False
        assert not console_errors(browser)


def test_without_a_global_layer_the_fleet_page_says_so(world: World) -> None:
    with headless_chromium() as browser:
        browser.get(f"{world.bare_viewer}/fleet")
        rows = wait_until(lambda: cluster_rows(browser) or None, timeout=60, what="the Thanos-only rows")
        assert browser.find_element(By.ID, "not-configured").is_displayed()
        assert "without --fleet-url" in browser.find_element(By.ID, "not-configured").text
        assert banner(browser) == []
        assert {k: (v["health"], v["gpus"], v["firing"]) for k, v in rows.items()} == {
            "a": ("no global layer", "3", "1"),
            "b": ("no global layer", "4", "0"),
        }
        assert not console_errors(browser)


def panel_states(browser: WebDriver) -> dict[str, dict[str, str]] | None:
    panels = browser.find_elements(By.CSS_SELECTOR, "[data-panel-title]")
    states = {
        p.get_attribute("data-panel-title"): {
            k: p.get_attribute(f"data-{k}") or "" for k in ("state", "names")
        }
        for p in panels
    }
    done = states and all(s["state"] in ("data", "nodata", "unavailable", "error") for s in states.values())
    return states if done else None


def test_the_cluster_dropdown_filters_the_panels_and_logs_panels_say_they_need_logs(world: World) -> None:
    gpus = "GPUs reporting, by cluster"
    with headless_chromium() as browser:
        browser.get(f"{world.viewer}/d/fleetsight-fleet?from=now-5m&to=now")
        before = wait_until(lambda: panel_states(browser), timeout=60, what="the fleet dashboard drawn")
        assert before[gpus]["state"] == "data" and set(before[gpus]["names"].split("|")) == {"a", "b"}
        select = Select(browser.find_element(By.CSS_SELECTOR, "select[name='cluster']"))
        assert [o.get_attribute("value") for o in select.options] == [ALL, "a", "b"]
        assert [o.text for o in select.all_selected_options] == ["All"]
        select.select_by_value("b")  # a click on b: b alone (All picked off)
        wait_until(lambda: "var-cluster=b" in browser.current_url, timeout=10, what="the URL to follow")
        after = wait_until(lambda: (s := panel_states(browser)) and s[gpus]["names"] == "b" and s, timeout=60,
                           what="the GPUs panel to show cluster b only")  # fmt: skip
        assert after[gpus]["state"] == "data"
        # no --logs: the researcher's logs panels say so instead of failing
        browser.get(f"{world.viewer}/d/fleetsight-my-job?from=now-5m&to=now")
        job = wait_until(lambda: panel_states(browser), timeout=60, what="the my-job dashboard drawn")
        assert job["Step time"]["state"] == job["Loss"]["state"] == "unavailable"
        assert not [t for t, s in job.items() if s["state"] == "error"], job
        assert "without --logs" in browser.find_element(By.CSS_SELECTOR, "[data-panel-title='Loss']").text
        assert not console_errors(browser)
