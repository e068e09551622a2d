"""Fuzz an HTTP API from its own OpenAPI schema with schemathesis: for every operation, hypothesis draws
requests (paths, queries, bodies) that the schema allows, sends them to the live server, and checks
each answer (no 5xx; status code, content type, headers and body as the schema documents them).
Shared by the tests (a bounded run) and bench/api_fuzz.py (a longer one that prints the counts)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance


@dataclass
class FuzzReport:
    requests: int = 0
    server_errors: int = 0
    schema_violations: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # the first few, each with its curl command

    def line(self, name: str) -> str:
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(self.by_status.items()))
        return (
            f"{name}: {self.requests} requests, {self.server_errors} 5xx, {self.schema_violations} schema "
            f"violations ({statuses})"
        )


def fuzz(schema_url: str, headers: dict[str, str], examples: int, seed: int | None = 0) -> FuzzReport:
    """Every operation of the schema at ``schema_url``, ``examples`` drawn requests each."""
    schema = schemathesis.openapi.from_url(schema_url)
    base_url = schema_url.rsplit("/openapi.json", 1)[0]
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()
        _fuzz_operation(operation, base_url, headers, examples, seed, report)
    return report


def _fuzz_operation(
    operation: Any,
    base_url: str,
    headers: dict[str, str],
    examples: int,
    seed: int | None,
    report: FuzzReport,
) -> None:
    options = {"max_examples": examples, "deadline": None, "suppress_health_check": list(HealthCheck)}
    if seed is not None:
        options["derandomize"] = True

    @settings(**options)
    @given(case=operation.as_strategy())
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, headers=headers)
        report.requests += 1
        report.by_status[response.status_code] += 1
        if response.status_code >= 500:
            report.server_errors += 1
        try:
            # every check but "a schema-valid request is accepted": a value the schema cannot express
            # (a duration of "0s", a reason naming an unknown node) is refused on purpose, with 4xx
            case.validate_response(response, excluded_checks=[positive_data_acceptance])
        except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis: a group of failed checks
            if response.status_code < 500:
                report.schema_violations += 1
            if len(report.failures) < 20:
                report.failures.append(
                    f"{case.method} {case.formatted_path}: {exc}\n{case.as_curl_command()}"
                )

    run()
