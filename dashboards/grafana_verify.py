"""The dashboards as a real Grafana serves them: listed in their persona's folder, stored as committed,
and every target run by Grafana's own query path (/api/ds/query: the datasource proxy, $__interval,
$__rate_interval and $__range filled server-side). Template variables are the frontend's job, so each
is set here to the first value its own query returns, asked through Grafana's datasource resources."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import httpx

from . import build, catalog

# Grafana's own fields in a stored dashboard, absent from the committed files.
GRAFANA_FIELDS = {"id", "version"}
PROMQL_WORDS = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
NOT_METRICS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan", "e",
}  # fmt: skip


# Prometheus's own series that exist only once an alert has been pending or firing.
FIRST_EVENT = {"ALERTS", "ALERTS_FOR_STATE"}


@dataclass
class PanelCheck:
    dashboard: str
    panel: str
    targets: int = 0
    with_data: int = 0
    errors: list[str] = field(default_factory=list)
    empty_reasons: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.errors:
            return "error"
        return "data" if self.with_data else "empty"


@dataclass
class DashboardCheck:
    uid: str
    folder: str
    problems: list[str] = field(default_factory=list)  # listing and round-trip faults
    panels: list[PanelCheck] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for panel in self.panels if panel.status == status)

    @property
    def failed(self) -> bool:
        return bool(self.problems) or self.count("error") > 0


def without_grafana_fields(dashboard: dict) -> dict:
    return {key: value for key, value in dashboard.items() if key not in GRAFANA_FIELDS}


def expected_folder(spec: catalog.Dashboard) -> str:
    """The folder provisioning puts a dashboard in (dashboards/provisioning/dashboards/fleetsight.yml)."""
    return spec.persona.title()


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (identifiers that are no function, keyword or label)."""
    without_variables = re.sub(r"\$\{?\w+\}?", "", re.sub(r'"[^"]*"', "", expr))
    without_labels = re.sub(r"\{[^}]*\}", "", without_variables)
    without_clauses = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_labels
    )
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_clauses)
    return {
        word
        for word in PROMQL_WORDS.findall(without_ranges)
        if word.lower() not in NOT_METRICS and not word[0].isdigit()
    }


def fill_variables(text: str, values: dict[str, str]) -> str:
    """Dashboard variables replaced as the frontend would; Grafana's own $__ variables are left."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)


class GrafanaCheck:
    def __init__(
        self,
        client: httpx.Client,
        start: float,
        end: float,
        offline: tuple[str, ...] = (),
        min_interval: str = "",
        absent_ok: re.Pattern[str] | None = None,
    ) -> None:
        self.client, self.start, self.end = client, start, end
        self.offline, self.min_interval, self.absent_ok = offline, min_interval, absent_ok
        self._metrics: dict[str, set[str]] = {}

    def resource(self, uid: str, path: str, params: dict[str, str]) -> list[str]:
        """A Prometheus API answer through Grafana's datasource resource proxy."""
        window = {"start": f"{self.start:.0f}", "end": f"{self.end:.0f}"}
        answer = self.client.get(f"/api/datasources/uid/{uid}/resources/{path}", params={**params, **window})
        answer.raise_for_status()
        return answer.json().get("data") or []

    def known_metrics(self, uid: str) -> set[str]:
        """Every metric name the datasource has ever held (no time bounds: all of its history)."""
        if uid not in self._metrics:
            answer = self.client.get(f"/api/datasources/uid/{uid}/resources/api/v1/label/__name__/values")
            answer.raise_for_status()
            self._metrics[uid] = set(answer.json().get("data") or [])
        return self._metrics[uid]

    def variables(self, stored: dict) -> dict[str, str]:
        values: dict[str, str] = {}
        for variable in stored.get("templating", {}).get("list", []):
            if variable.get("type") == "constant":
                values[variable["name"]] = str(variable.get("query", ""))
                continue
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, dict) else str(query)
            found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", text.strip())
            uid = (variable.get("datasource") or {}).get("uid", catalog.PROMETHEUS)
            if found:
                label = self.resource(
                    uid, f"api/v1/label/{found.group(2)}/values", {"match[]": found.group(1)}
                )
                if label:
                    values[variable["name"]] = sorted(label)[0]
        return values

    def query(self, target: dict, panel: dict, values: dict[str, str]) -> tuple[int, str]:
        """Post one target; (frames with values, error)."""
        datasource = target.get("datasource") or panel.get("datasource") or {}
        sent = json.loads(fill_variables(json.dumps(target), values))
        sent["datasource"] = datasource
        sent.setdefault("refId", "A")
        sent["maxDataPoints"] = 500
        if self.min_interval:
            sent["interval"] = self.min_interval
        body = {"from": f"{self.start * 1000:.0f}", "to": f"{self.end * 1000:.0f}", "queries": [sent]}
        answer = self.client.post("/api/ds/query", json=body)
        try:
            results = answer.json().get("results", {})
        except ValueError:
            return 0, f"HTTP {answer.status_code}: {answer.text[:200]}"
        result = results.get(sent["refId"], {})
        if answer.status_code >= 400 or result.get("error"):
            message = result.get("error") or answer.json().get("message") or answer.text[:200]
            return 0, f"HTTP {answer.status_code}: {message}"
        frames = result.get("frames") or []
        with_values = [
            f for f in frames if any(len(column) for column in f.get("data", {}).get("values", []))
        ]
        return len(with_values), ""

    def why_empty(self, uid: str, expr: str, needs: str) -> tuple[str, str]:
        """(reason, error) for a target without data. A metric no series has ever had is an error (a
        wrong name), unless the panel needs a component that writes it, or it may be absent here."""
        unknown = sorted(metric_names(expr) - self.known_metrics(uid))
        if not unknown:
            return (
                "its metrics have series; none matched its filter in the window (no fault of that kind)",
                "",
            )
        names = ", ".join(unknown)
        if set(unknown) <= FIRST_EVENT:
            return f"no series of {names} yet: it appears with the first alert Prometheus evaluates", ""
        if needs:
            return f"needs {needs}: no series of {names}", ""
        if self.absent_ok and all(self.absent_ok.search(name) for name in unknown):
            return f"no series of {names}: not written here (--may-be-absent)", ""
        return "", f"no series of {names} has ever existed: a wrong metric name?"

    def panel(self, dashboard: str, panel: dict, values: dict[str, str], needs: str = "") -> PanelCheck:
        check = PanelCheck(dashboard, panel.get("title", "?"))
        for target in panel.get("targets", []):
            uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid", "")
            check.targets += 1
            if uid in self.offline:
                check.empty_reasons.append(f"datasource {uid} is not running here")
                continue
            frames, error = self.query(target, panel, values)
            if error:
                check.errors.append(f"{target.get('refId', '?')}: {error}")
            elif frames:
                check.with_data += 1
            elif "expr" in target:
                reason, error = self.why_empty(uid, fill_variables(target["expr"], values), needs)
                if error:
                    check.errors.append(f"{target.get('refId', '?')}: {error}")
                else:
                    check.empty_reasons.append(reason)
            else:
                check.empty_reasons.append("no documents matched in the window")
        return check

    def dashboard(self, spec: catalog.Dashboard, listed: dict[str, dict]) -> DashboardCheck:
        check = DashboardCheck(spec.uid, expected_folder(spec))
        entry = listed.get(spec.uid)
        if entry is None:
            check.problems.append("not listed by Grafana: provisioning did not load it")
            return check
        if entry.get("folderTitle", "General") != check.folder:
            check.problems.append(
                f"listed in folder {entry.get('folderTitle', 'General')!r}, not {check.folder!r}"
            )
        answer = self.client.get(f"/api/dashboards/uid/{spec.uid}")
        answer.raise_for_status()
        stored = answer.json()["dashboard"]
        committed = json.loads(build.path_of(spec).read_text())
        if without_grafana_fields(stored) != without_grafana_fields(committed):
            check.problems.append("the stored JSON differs from the committed file")
        values = self.variables(stored)
        needs = {panel.title: panel.needs for panel in spec.panels()}
        for panel in stored.get("panels", []):
            if panel.get("type") != "row":
                title = panel.get("title", "")
                check.panels.append(self.panel(spec.uid, panel, values, needs.get(title, "")))
        return check


def verify(
    url: str,
    start: float,
    end: float,
    offline: tuple[str, ...] = (),
    min_interval: str = "",
    auth: tuple[str, str] | None = None,
    absent_ok: re.Pattern[str] | None = None,
) -> list[DashboardCheck]:
    """Every catalogued dashboard as the Grafana at URL serves it, its targets over [start, end]."""
    with httpx.Client(base_url=url, timeout=60, auth=auth) as client:
        search = client.get("/api/search", params={"type": "dash-db", "limit": 5000})
        search.raise_for_status()
        listed = {entry["uid"]: entry for entry in search.json()}
        check = GrafanaCheck(client, start, end, offline, min_interval, absent_ok)
        return [check.dashboard(spec, listed) for spec in catalog.DASHBOARDS]


def table(checks: list[DashboardCheck]) -> str:
    """Per dashboard: panels queried / with data / empty (with reason) / errors, then the details."""
    rows = [f"{'dashboard':<26} {'folder':<11} {'queried':>7} {'data':>5} {'empty':>5} {'errors':>6}"]
    details = []
    for check in checks:
        errors = check.count("error") + len(check.problems)
        rows.append(
            f"{check.uid:<26} {check.folder:<11} {len(check.panels):>7} {check.count('data'):>5} "
            f"{check.count('empty'):>5} {errors:>6}"
        )
        details += [f"ERROR {check.uid}: {problem}" for problem in check.problems]
        for panel in check.panels:
            if panel.status == "error":
                details += [f"ERROR {check.uid} / {panel.panel}: {error}" for error in panel.errors]
            elif panel.status == "empty":
                details.append(f"empty {check.uid} / {panel.panel}: {panel.empty_reasons[0]}")
    return "\n".join(rows + details)
