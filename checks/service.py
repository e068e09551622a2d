"""The checks service: it keeps the latest result of every (node, check), serves them to the health
service's validation gate and to people (GET /v1/results), and publishes them to Prometheus:

- ``fleetsight_check_passed{cluster,node,check}``: 1 passed, 0 failed; written only for those two
  outcomes, so that a check that could not look never reads as a failure (ActiveCheckFailed);
- ``fleetsight_check_unknown{cluster,node,check,reason}``: 1 when the last run could not observe the node
  (tool_missing, timeout, unreachable, unauthorised, tls, not_published, unreadable, not_run): the
  deployment's blind spot, which FleetSightBlind reports and which never drains;
- ``fleetsight_check_last_run_timestamp_seconds{cluster,node,check}``: when that result finished.

Results arrive by POST /v1/results from whatever ran the check (a light-check timer on the node, the
Slurm batch job, the Kubernetes Job), so the service never reaches into nodes itself. A posted PASS can
resume a drained node (the health service's validation gate), so a post needs a bearer token with scope
``results`` (fleetsight.auth's scheme: FLEETSIGHT_CHECKS_TOKENS, FLEETSIGHT_CHECKS_TOKENS_FILE, or the bare
token of ``checks serve --results-token-file``); reads are open on the cluster network unless the
service is started with ``--token-reads``."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetsight import auth

from . import scan_service
from .catalog import Check
from .outcomes import BLIND_REASONS, OUTCOMES
from .runner import STATUS
from .scan import load_scans
from .scan_service import SCANS_FILE, ScanBook

POLICY_FILE = Path(__file__).resolve().parent / "policy.yml"
REQUIRED = ("node", "check", "summary", "finished")
# The service's scopes: `read` (results, policy, catalogue, /metrics; open unless --token-reads) and
# `results` (POST /v1/results: what the light checks, the Slurm jobs and the Kubernetes Jobs send).
RESULTS = "results"
SCOPES = (auth.READ, RESULTS)
TOKENS_PREFIX = "FLEETSIGHT_CHECKS"


def load_policy(path: Path = POLICY_FILE) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text()) or {}
    after, default = raw.get("after"), raw.get("default")
    if not isinstance(after, dict) or not isinstance(default, list):
        raise ValueError(f"{path}: expected 'after' (signal -> checks) and 'default' (checks)")
    return {"after": after, "default": default, "scans": raw.get("scans") or {}}


def validate_policy(policy: dict[str, Any], catalog: dict[str, Check]) -> None:
    for signal, names in [*policy["after"].items(), ("default", policy["default"])]:
        unknown = [n for n in names if n not in catalog]
        if unknown:
            raise ValueError(f"policy {signal}: unknown checks {', '.join(unknown)}")
    load_scans(policy.get("scans"), catalog)  # ScanPolicyError (a ValueError) names the scan and key


class ResultStore:
    """The latest result per (node, check), saved atomically to ``state_file`` after each change."""

    def __init__(self, catalog: dict[str, Check], state_file: Path | None = None) -> None:
        self.catalog = catalog
        self.state_file = state_file
        self.lock = threading.Lock()
        self.latest: dict[tuple[str, str], dict[str, Any]] = {}
        if state_file is not None and state_file.exists():
            for item in json.loads(state_file.read_text()):
                if item.get("check") in catalog:  # a check dropped from the catalogue is forgotten
                    item = self._normalise(item)
                    self.latest[(item["node"], item["check"])] = item

    def add(self, results: list[Any]) -> int:
        normalised = [self._normalise(item) for item in results]
        with self.lock:
            for item in normalised:
                key = (item["node"], item["check"])
                if key not in self.latest or self.latest[key]["finished"] <= item["finished"]:
                    self.latest[key] = item
            self._save()
        return len(results)

    def _normalise(self, item: Any) -> dict[str, Any]:
        """The result with ``outcome``, ``passed`` (null for an unknown) and ``status`` consistent; a
        poster older than outcomes sends ``passed`` true/false alone. ValueError names what is wrong."""
        if not isinstance(item, dict) or any(k not in item for k in REQUIRED):
            raise ValueError(f"a result needs {', '.join(REQUIRED)}: {str(item)[:200]}")
        if item["check"] not in self.catalog:
            raise ValueError(f"unknown check {item['check']!r}")
        if not isinstance(item["finished"], int | float) or isinstance(item["finished"], bool):
            raise ValueError("'finished' must be a unix time")
        outcome = item.get("outcome")
        if outcome is None:
            if not isinstance(item.get("passed"), bool):
                raise ValueError("a result needs 'outcome' (passed, failed, unknown) or 'passed' true/false")
            outcome = "passed" if item["passed"] else "failed"
        if outcome not in OUTCOMES:
            raise ValueError(f"'outcome' must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        if "passed" in item and item["passed"] is not None and item["passed"] != (outcome == "passed"):
            raise ValueError(f"'passed' {item['passed']!r} contradicts 'outcome' {outcome!r}")
        reason = item.get("reason") or ""
        if outcome == "unknown" and reason not in BLIND_REASONS:
            raise ValueError(f"an unknown needs a 'reason', one of {', '.join(BLIND_REASONS)}")
        normalised = {
            **item,
            "outcome": outcome,
            "passed": None if outcome == "unknown" else outcome == "passed",
        }
        normalised["status"] = STATUS[outcome]
        if outcome != "unknown":
            normalised.pop("reason", None)
        return normalised

    def _save(self) -> None:
        if self.state_file is None:
            return
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(self.latest.values())))
        os.replace(tmp, self.state_file)

    def results(self, node: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [r for (n, _), r in sorted(self.latest.items()) if node is None or n == node]


class ResultCollector(Collector):
    def __init__(self, store: ResultStore, cluster: str) -> None:
        self.store, self.cluster = store, cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["cluster", "node", "check"]
        passed = GaugeMetricFamily(
            "fleetsight_check_passed",
            "1 when the node's last run of the check passed, 0 when it failed.",
            labels=labels,
        )
        unknown = GaugeMetricFamily(
            "fleetsight_check_unknown",
            "1 when the node's last run of the check could not observe it; reason says why.",
            labels=[*labels, "reason"],
        )
        stamp = GaugeMetricFamily(
            "fleetsight_check_last_run_timestamp_seconds",
            "Unix time the node's last run of the check finished.",
            labels=labels,
        )
        for item in self.store.results():
            values = [self.cluster, item["node"], item["check"]]
            if item["outcome"] == "unknown":
                unknown.add_metric([*values, item["reason"]], 1.0)
            else:
                passed.add_metric(values, 1.0 if item["outcome"] == "passed" else 0.0)
            stamp.add_metric(values, float(item["finished"]))
        yield passed
        yield unknown
        yield stamp


def create_app(store: ResultStore, policy: dict[str, Any], cluster: str, guard: auth.TokenGuard) -> FastAPI:
    """The API: a post needs scope ``results`` (unless ``guard.open_scopes`` has it: --open-writes), a
    read scope ``read`` when ``guard.open_reads`` is false."""
    app = FastAPI(title="FleetSight checks service", version="1", responses=auth.ERROR_RESPONSES)
    registry = CollectorRegistry()
    registry.register(ResultCollector(store, cluster))
    reader = [Depends(guard.require(auth.READ))]
    writer = [Depends(guard.require(RESULTS))]
    # scan plans (checks/scan_service.py): last completed scans kept in scans.json beside results.json
    scans_file = store.state_file.with_name(SCANS_FILE) if store.state_file is not None else None
    book = ScanBook(load_scans(policy.get("scans"), store.catalog), scans_file, store.results())

    def known_nodes() -> set[str]:
        return {r["node"] for r in store.results()}

    scan_service.add_to(registry, book, known_nodes, cluster)
    scan_service.register(app, book, known_nodes, reader, writer)

    @app.post("/v1/results", summary="Record check results (a list of result records)", dependencies=writer)
    async def post_results(request: Request) -> dict[str, int]:
        try:
            body = await request.json()
            if not isinstance(body, list):
                raise ValueError("the body must be a list of results")
            recorded = store.add(body)
            book.record(body)  # accepted results only: add() raised on a bad one
            return {"recorded": recorded}
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc

    @app.get("/v1/results", summary="Latest result per node and check (?node=)", dependencies=reader)
    async def get_results(node: str | None = None) -> dict[str, Any]:
        return {"results": store.results(node)}

    @app.get("/v1/policy", summary="Which checks must pass after which fault", dependencies=reader)
    async def get_policy() -> dict[str, Any]:
        return policy

    @app.get("/v1/catalog", summary="The check catalogue", dependencies=reader)
    async def get_catalog() -> dict[str, Any]:
        return {
            n: {"kind": c.kind, "seconds": c.seconds, "disturbs": c.disturbs}
            for n, c in store.catalog.items()
        }

    @app.get("/metrics", include_in_schema=False, dependencies=reader)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.get("/-/ready", include_in_schema=False)
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    return app
