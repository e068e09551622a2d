"""The dashboard viewer (`fleetsight dashboards serve`, dashboards/viewer/) on a live twin stack, in Debian's
Chromium: every dashboard of the committed JSON drawn with its panels' data or their declared "no data",
no console errors, a variable that changes what the panels show, the same numbers as the project's query
runner, and a thermal fault that shows on the SRE dashboard and on the fleet overview within a minute.

The stack is the components' own (twin, node agents, Alertmanager, the anomaly service, Prometheus with
the rules, the health service) playing tests/dashboards/viewer_scenario.yaml in real time; the viewer reads
its Prometheus directly (`make up` points it at Thanos Query: the same API). Set FLEETSIGHT_SCREENSHOTS to a
folder to keep a screenshot of every page drawn (`make screenshots` writes docs/images/dashboards/).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from browser import console_errors, headless_chromium
from dashboards import catalog, model, verify
from dashboards.common_queries import THERMAL
from evaluation.health import TwinStack
from fleetsight.settings import REPO_ROOT
from support import Process, free_port, free_port_base, stopping, wait_until

SCENARIO = Path(__file__).with_name("viewer_scenario.yaml")
AROUND = ("slack-sink", "alertmanager", "exporter-node", "anomaly", "prometheus")
HOT_NODE = "n0003"  # the scenario's thermal throttle: GPU 2 of n0003 from the start (it throttles once hot)
HEAT_PANEL = "GPUs slowed by heat or a power brake, and failed PSUs"
FLEETSIGHT = [sys.executable, "-m", "fleetsight.cli"]
SHOTS = os.environ.get("FLEETSIGHT_SCREENSHOTS")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("viewer")
    stack = TwinStack(folder, SCENARIO, free_port_base(), REPO_ROOT / "health" / "policy.yml", around=AROUND)
    try:
        stack.start()
        assert not stack.problems(), f"the stack did not start: {stack.problems()}"
        prometheus = stack.settings.url("prometheus")
        port = free_port()
        command = [
            *FLEETSIGHT,
            "dashboards",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--prometheus",
            prometheus,
        ]
        viewer = Process("dashboards", command, folder / "viewer.log")
        with stopping(viewer):
            url = f"http://127.0.0.1:{port}"
            viewer.wait_ready(f"{url}/healthz")
            # The job variable is a recorded series: there once the anomaly service has been scraped.
            jobs = wait_until(
                lambda: job_options(url), timeout=120, what="the my-job dashboard's job variable"
            )
            yield {"url": url, "prometheus": prometheus, "stack": stack, "job": jobs[0]}
    finally:
        stack.stop()


def job_options(url: str) -> list[str]:
    answer = httpx.get(f"{url}/api/dashboards/fleetsight-my-job/variables", params={"from": "now-15m"}).json()
    return next(v["options"] for v in answer["variables"] if v["name"] == "hpc_job")


# ------------------------------------------------------------------------------------------ the API
def test_bad_input_gets_a_clear_error(live: dict[str, Any]) -> None:
    url = live["url"]
    query = f"{url}/api/dashboards/fleetsight-node/query"
    bad_range = httpx.post(query, json={"panel": "1", "from": "now-banana", "to": "now"})
    assert bad_range.status_code == 400 and "now-banana" in bad_range.json()["detail"]
    backwards = httpx.post(query, json={"panel": "1", "from": "now", "to": "now-1h"})
    assert backwards.status_code == 400 and "before it starts" in backwards.json()["detail"]
    no_panel = httpx.post(query, json={"panel": "99", "from": "now-1h", "to": "now"})
    assert no_panel.status_code == 400 and "no panel '99'" in no_panel.json()["detail"]
    unknown = httpx.get(f"{url}/api/dashboards/nope")
    assert unknown.status_code == 404 and "fleetsight-node" in unknown.json()["detail"]
    assert httpx.get(f"{url}/d/nope").status_code == 404
    assert httpx.get(f"{url}/static/..%2Fapp.py").status_code == 404


def viewer_series(
    url: str, uid: str, dashboard: dict[str, Any], window: tuple[float, float], chosen: dict[str, str]
) -> dict[str, int]:
    """Frames per panel title, as the viewer answers for the window (epoch ms, as its pages send)."""
    found = {}
    for panel in panels_of(dashboard):
        body = {
            "panel": panel["viewerKey"],
            "vars": chosen,
            "from": str(window[0] * 1000),
            "to": str(window[1] * 1000),
        }
        answer = httpx.post(f"{url}/api/dashboards/{uid}/query", json=body, timeout=60).json()
        found[panel["title"]] = len(answer["frames"])
    return found


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])] if "viewerKey" in p]


def test_the_viewer_answers_the_same_numbers_as_the_query_runner(live: dict[str, Any]) -> None:
    """Per panel, as many series as `fleetsight dashboards verify`'s runner gets for the same window and
    variables (a logs panel: no logs URL here, so neither runs it)."""
    end = time.time()
    window = (end - 600, end)
    chosen = {
        "hpc_job": live["job"],
        "node": HOT_NODE,
        "node_capacity_watts": "10200",
        "price_per_kwh": "0.12",
    }
    expected: dict[tuple[str, str], int] = {}
    for result in verify.run_queries(live["prometheus"], chosen, end, range_s=600):
        if not result.skipped:
            key = (result.dashboard, result.panel)
            expected[key] = expected.get(key, 0) + result.series
    with_series = [key for key, n in expected.items() if n]
    # Most panels list faults and are empty on a healthy twin; comparing only empty ones would prove nothing.
    assert len(with_series) >= 10, f"too few panels with data to compare: {with_series}"
    for uid in {d for d, _ in expected}:
        dashboard = httpx.get(f"{live['url']}/api/dashboards/{uid}").json()["dashboard"]
        names = {x["name"] for x in dashboard.get("templating", {}).get("list", [])}
        variables = {k: v for k, v in chosen.items() if k in names}
        got = viewer_series(live["url"], uid, dashboard, window, variables)
        wanted = {panel: n for (d, panel), n in expected.items() if d == uid}
        # A series can appear or end between the two runs: a difference must be rare, not the rule.
        differing = {p: (got[p], n) for p, n in wanted.items() if got[p] != n}
        assert len(differing) <= 1, f"{uid}: viewer vs runner series differ: {differing}"


# ------------------------------------------------------------------------------------- the browser
def drawn(browser: WebDriver) -> list[dict[str, str]] | None:
    """Every panel's state once all are drawn, else None."""
    panels = browser.find_elements(By.CSS_SELECTOR, "[data-panel-title]")
    states = [
        {k: p.get_attribute(f"data-{k}") or "" for k in ("panel-title", "state", "frames", "names", "sum")}
        for p in panels
    ]
    ready = states and all(s["state"] in ("data", "nodata", "unavailable", "error") for s in states)
    return states if ready else None


def open_page(browser: WebDriver, url: str, what: str) -> list[dict[str, str]]:
    browser.get(url)
    states = wait_until(lambda: drawn(browser), timeout=60, interval=0.5, what=f"{what}: every panel drawn")
    return states


def screenshot(browser: WebDriver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def declared_empty(spec: model.Dashboard) -> set[str]:
    """Panels that may say "no data" on a healthy twin: those that need a component or an event, those
    that list only faults (a comparison or ALERTS) and the logs panels (no OpenSearch in this stack)."""
    return {
        p.title
        for p in spec.panels()
        if p.needs
        or any(
            q.datasource != model.PROMETHEUS or "ALERTS" in q.expr or "==" in q.expr or ">" in q.expr
            for q in p.queries
        )
    }


def test_every_dashboard_draws_in_chromium(live: dict[str, Any]) -> None:
    url, rows = live["url"], []
    with headless_chromium() as browser:
        browser.get(url)
        listed = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "a[href^='/d/']"), timeout=30,
                            what="the home page's dashboard links")  # fmt: skip
        assert {a.get_attribute("href").split("/d/")[1] for a in listed} >= {
            s.uid for s in catalog.DASHBOARDS
        }
        for spec in catalog.DASHBOARDS:
            page = f"{url}/d/{spec.uid}?from=now-15m&to=now&var-hpc_job={live['job']}&var-node={HOT_NODE}"
            states = open_page(browser, page, spec.uid)
            errors = console_errors(browser)
            empty = {s["panel-title"] for s in states if s["state"] == "nodata"}
            failed = {s["panel-title"]: s for s in states if s["state"] == "error"}
            unavailable = {s["panel-title"] for s in states if s["state"] == "unavailable"}
            rows.append(
                (
                    spec.uid,
                    len(states),
                    sum(s["state"] == "data" for s in states),
                    len(empty),
                    len(failed),
                    len(errors),
                )
            )
            assert len(states) == len(spec.panels()), (
                f"{spec.uid}: {len(states)} panels drawn of {len(spec.panels())}"
            )
            assert not errors, f"{spec.uid}: console errors {errors}"
            logs_panels = {
                p.title for p in spec.panels() if any(q.datasource == model.LOGS for q in p.queries)
            }
            assert not failed, f"{spec.uid}: panels in error {failed}"
            # no --logs here: the logs panels say they need it, and only they
            assert unavailable == logs_panels, f"{spec.uid}: unavailable {unavailable}, logs {logs_panels}"
            assert empty <= declared_empty(spec), (
                f"{spec.uid}: empty on a running twin: {empty - declared_empty(spec)}"
            )
    header = f"{'dashboard':<26} panels  with data  no data  errors  console errors"
    lines = [f"{d:<26} {p:>6} {w:>10} {n:>8} {e:>7} {c:>15}" for d, p, w, n, e, c in rows]
    print("\n".join(["", header, *lines]))


def test_a_variable_changes_what_the_panels_show(live: dict[str, Any]) -> None:
    with headless_chromium() as browser:
        before = open_page(
            browser, f"{live['url']}/d/fleetsight-node?from=now-15m&to=now&var-node=n0001", "node n0001"
        )
        select = Select(browser.find_element(By.CSS_SELECTOR, "select[name='node']"))
        select.select_by_value(HOT_NODE)
        wait_until(
            lambda: f"var-node={HOT_NODE}" in browser.current_url, timeout=10, what="the URL to follow"
        )

        def redrawn() -> list[dict[str, str]] | None:
            states = drawn(browser)
            return states if states and states != before else None

        after = wait_until(redrawn, timeout=60, interval=0.5, what="the panels to show the other node")
        power = {s["panel-title"]: s["sum"] for s in before}, {s["panel-title"]: s["sum"] for s in after}
        assert power[0]["GPU power"] != power[1]["GPU power"], power
        assert not console_errors(browser)


def first_seen(frames: list[dict[str, Any]], name: str) -> float | None:
    """The time (unix seconds) of the first non-null point of the frame called ``name``."""
    for frame in frames:
        if frame["name"] == name:
            return next((t / 1000 for t, v in frame["points"] if v is not None), None)
    return None


def heat_panel_frames(url: str) -> list[dict[str, Any]]:
    dashboard = httpx.get(f"{url}/api/dashboards/fleetsight-fleet-health").json()["dashboard"]
    key = next(p["viewerKey"] for p in panels_of(dashboard) if p["title"] == HEAT_PANEL)
    body = {"panel": key, "from": "now-15m", "to": "now"}
    return httpx.post(f"{url}/api/dashboards/fleetsight-fleet-health/query", json=body).json()["frames"]


def alert_rows(browser: WebDriver) -> list[str]:
    return [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#alerts tbody tr")]


def take_screenshots(browser: WebDriver, live: dict[str, Any]) -> None:
    browser.get(live["url"])
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "a[href^='/d/']"), timeout=30, what="home")
    screenshot(browser, "home")
    for spec in catalog.DASHBOARDS:
        page = f"{live['url']}/d/{spec.uid}?from=now-5m&to=now&var-hpc_job={live['job']}&var-node={HOT_NODE}"
        open_page(browser, page, spec.uid)
        screenshot(browser, spec.uid)


def first_sample(prometheus: str, query: str, since: float) -> float:
    """The time of the first sample of ``query`` on HOT_NODE after ``since`` (a 1 s step: within a second)."""
    params = {"query": query, "start": since, "end": time.time(), "step": "1s"}
    answer = httpx.get(f"{prometheus}/api/v1/query_range", params=params).json()["data"]["result"]
    series = [s for s in answer if s["metric"].get("node") == HOT_NODE]
    assert series, f"no sample of {query} on {HOT_NODE} since {since}"
    return min(float(t) for s in series for t, _ in s["values"])


def test_a_thermal_fault_shows_on_the_sre_dashboard_and_the_overview_within_a_minute(
    live: dict[str, Any],
) -> None:
    """The pages stay open and refresh themselves (the dashboard every 30 s, its JSON's refresh; the overview
    every 15 s). The twin's GPU heats up first (its cooling fails at onset; the clocks slow once it reaches
    its slowdown point, twin/gpu.py): from the first throttled sample Prometheus holds, the panel's data and
    the pending alert each follow within seconds, and with their page's refresh within the minute. Read
    from the data's own times, so it holds whenever the test gets here."""
    stack: TwinStack = live["stack"]
    thermal = wait_until(lambda: [f for f in stack.faults() if f.kind == "thermal_throttle"], timeout=240,
                         what="the scenario's thermal throttle to begin")[0]  # fmt: skip
    assert thermal.node == HOT_NODE
    with headless_chromium() as browser:
        browser.get(f"{live['url']}/d/fleetsight-fleet-health?from=now-15m&to=now&refresh=30s")
        heat = f"{HOT_NODE} heat"

        def heat_drawn() -> bool:
            states = drawn(browser) or []
            return any(s["panel-title"] == HEAT_PANEL and heat in s["names"].split("|") for s in states)

        wait_until(
            heat_drawn, timeout=120, interval=1, what="n0003's heat drawn on the open fleet-health page"
        )
        screenshot(browser, "fleetsight-fleet-health-thermal")
        browser.get(f"{live['url']}/overview")

        def alert_listed() -> bool:
            return any("GPUThermalThrottling" in row and HOT_NODE in row for row in alert_rows(browser))

        wait_until(alert_listed, timeout=60, interval=1, what="n0003's thermal alert on the open overview")
        screenshot(browser, "overview-thermal")
        node = browser.find_element(By.CSS_SELECTOR, f"#nodes [data-node='{HOT_NODE}']")
        assert node.get_attribute("data-state") in ("healthy", "suspect", "degraded"), node.get_attribute(
            "data-state"
        )
        assert not console_errors(browser)
        if SHOTS:  # every page during the fault, over the few minutes the twin has played
            take_screenshots(browser, live)
    prometheus, since = live["prometheus"], thermal.onset - 30
    throttled = first_sample(prometheus, f"count by (node) ({THERMAL})", since)  # the panel's query
    on_panel = first_seen(heat_panel_frames(live["url"]), heat)
    alerted = first_sample(prometheus, 'ALERTS{alertname="GPUThermalThrottling"}', since)
    assert on_panel is not None
    panel_s, alert_s = on_panel - throttled, alerted - throttled
    heating = throttled - thermal.onset
    print(
        f"\nthermal throttle on {HOT_NODE}: cooling failed at onset, the GPU throttled {heating:.0f} s later "
        f"(first sample); then in the SRE panel's data {panel_s:.0f} s later (+ <= 30 s page refresh), "
        f"its alert pending {alert_s:.0f} s later (+ <= 15 s overview refresh)"
    )
    assert panel_s + 30 <= 60 and alert_s + 15 <= 60, (panel_s, alert_s)
