"""Checks the dashboards without Grafana: every PromQL query against a real Prometheus, and the JSON
against Grafana's own TypeScript types (`@grafana/schema`, compiled by `tsc --strict`)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleetsight.settings import Settings

from . import build, catalog
from .npm import npm_dir, tsc_path


@dataclass(frozen=True)
class QueryResult:
    dashboard: str
    panel: str
    expr: str
    series: int
    error: str = ""


def substitute(expr: str, variables: dict[str, str], range_s: int) -> str:
    """Grafana's variables replaced as Grafana would before sending the query."""
    values = {
        "__rate_interval": "1m",
        "__interval": "1m",
        "__range": f"{range_s}s",
        "__range_s": str(range_s),
        **variables,
    }
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), expr)


def run_queries(
    prometheus_url: str, variables: dict[str, str], at: float, range_s: int = 3600
) -> list[QueryResult]:
    """Every PromQL query of every dashboard, evaluated at `at` (an instant query: what the last point
    of a panel would show)."""
    results = []
    with httpx.Client(base_url=prometheus_url, timeout=30) as client:
        for spec in catalog.DASHBOARDS:
            for item in spec.panels():
                for query in item.queries:
                    if query.datasource != catalog.PROMETHEUS:
                        continue
                    expr = substitute(query.expr, variables, range_s)
                    answer = client.get("/api/v1/query", params={"query": expr, "time": at}).json()
                    if answer.get("status") != "success":
                        results.append(QueryResult(spec.uid, item.title, expr, 0, answer.get("error", "?")))
                    else:
                        results.append(QueryResult(spec.uid, item.title, expr, len(answer["data"]["result"])))
    return results


def typecheck(settings: Settings, out_dir: Path | None = None) -> tuple[bool, str]:
    """Compile every dashboard as a `Dashboard` of @grafana/schema with `tsc --noEmit --strict`."""
    tsc = tsc_path(settings)
    if not tsc.exists():
        raise FileNotFoundError(f"{tsc} is missing: run `fleetsight setup --only grafana-schema`")
    with tempfile.TemporaryDirectory(dir=npm_dir(settings)) as work:
        files = []
        for spec in catalog.DASHBOARDS:
            text = (out_dir / build.path_of(spec).name).read_text() if out_dir else build.render(spec)
            source = Path(work) / f"{spec.uid.replace('-', '_')}.ts"
            source.write_text(
                'import { Dashboard } from "@grafana/schema";\n'
                f"export const dashboard: Dashboard = {json.dumps(json.loads(text), indent=1)};\n"
            )
            files.append(str(source))
        result = subprocess.run(
            [str(tsc), "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "node", *files],
            capture_output=True,
            text=True,
            cwd=npm_dir(settings),
        )
    return result.returncode == 0, (result.stdout + result.stderr).replace(work, "<dashboards>")
