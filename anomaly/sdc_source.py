"""Training records from the log store (OpenSearch or Elasticsearch, over its REST API with httpx, as the
rest of FleetSight's log path talks to it): the jobs that logged training steps in a window, and one job's
records in step order, as anomaly/sdc_records.py reads the indexed documents.

The documents are the log pipeline's (pipelines/catalogue.py, docs/logs.md): ``fleetsight.hpc_job``,
``host.name``, ``training.step``, ``training.loss`` (or ``training.loss_finite: false``),
``training.grad_norm`` and, on a replica's own line, ``training.replica``; for the pace check
(anomaly/pace.py) ``training.step_time_ms`` and, where a rank splits its step, ``training.data_ms``,
``training.compute_ms`` and ``training.comm_ms``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetsight.search_pages import PagingError, sorted_pages

from .sdc import Record, SdcInputError
from .sdc_records import from_documents

LOG_INDEX = "fleetsight-logs-*"
ACTIONS = ("training_progress", "loss_nonfinite")
PAGE = 5000
FIELDS = ["@timestamp", "event.ingested", "fleetsight.hpc_job", "host.name", "training.*"]
# Step, then time, then host: anomaly/sdc_window.py `in_store_order` sorts kept documents the same way.
SORT = [{"training.step": "asc"}, {"@timestamp": "asc"}, {"host.name": "asc"}]


class SourceError(RuntimeError):
    """The log store could not be read: says where and why (unreachable, refused, an error answer)."""


class JobReadError(SourceError):
    """One job's documents could not be read whole (the store answered, but they cannot be paged):
    that job is unknown, the others are read as usual."""


@dataclass
class LogStore:
    url: str
    login: tuple[str, str] | None = field(default=None, repr=False)
    ca_file: str | None = None
    timeout_s: float = 30.0
    max_records: int = 500_000  # per job and window: a bound on one job's read
    page: int = PAGE  # documents per search_after page

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
        )
        self.client = httpx.Client(timeout=self.timeout_s, verify=verify, auth=self.login)

    def close(self) -> None:
        self.client.close()

    def _search(self, body: dict[str, Any]) -> dict[str, Any]:
        where = f"{self.url}/{LOG_INDEX}/_search"
        params = {"ignore_unavailable": "true", "allow_no_indices": "true"}
        try:
            response = self.client.post(where, params=params, json=body)
        except httpx.HTTPError as exc:
            raise SourceError(f"log store unreachable at {self.url}: {exc}") from exc
        if response.status_code in (401, 403):
            raise SourceError(
                f"log store refused the login (HTTP {response.status_code}): give a user with read access "
                "to the fleetsight-logs-* indices"
            )
        if not response.is_success:
            raise SourceError(f"log store answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            return response.json()
        except ValueError as exc:
            raise SourceError(
                f"log store answered something that is not JSON: {response.text[:200]}"
            ) from exc

    @staticmethod
    def _filters(
        since: str, job: str | None = None, ingested_after: float | None = None
    ) -> list[dict[str, Any]]:
        filters: list[dict[str, Any]] = [
            {"range": {"@timestamp": {"gte": f"now-{since}"}}},
            {"terms": {"event.action": list(ACTIONS)}},
            {"exists": {"field": "training.step"}},
        ]
        if job is not None:
            filters.append({"term": {"fleetsight.hpc_job": job}})
        if ingested_after is not None:  # unix seconds; the store's dates in epoch_millis
            millis = int(ingested_after * 1000)
            filters.append({"range": {"event.ingested": {"gte": millis, "format": "epoch_millis"}}})
        return filters

    def jobs(self, since: str = "6h", limit: int = 1000) -> list[str]:
        """The jobs that logged training steps in the window."""
        body = {
            "size": 0,
            "query": {"bool": {"filter": self._filters(since)}},
            "aggs": {"jobs": {"terms": {"field": "fleetsight.hpc_job", "size": limit}}},
        }
        buckets = self._search(body).get("aggregations", {}).get("jobs", {}).get("buckets", [])
        return sorted(str(b["key"]) for b in buckets)

    def records(self, job: str, since: str = "6h") -> list[Record]:
        """A job's training records in the window, in step order (paged with search_after)."""
        return self.to_records(job, self.sources(job, since))

    @staticmethod
    def to_records(job: str, sources: list[dict[str, Any]]) -> list[Record]:
        """The silent-corruption check's records of a job's documents (one read serves both checks)."""
        try:
            return from_documents(sources)
        except SdcInputError as exc:
            raise SourceError(f"job {job}: {exc}") from exc

    def sources(self, job: str, since: str = "6h") -> list[dict[str, Any]]:
        """A job's training documents in the window (``_source``), in step order, paged with
        search_after: what both the silent-corruption and the pace checks read."""
        return [source for _, source in self.documents(job, since)]

    def documents(
        self, job: str, since: str = "6h", ingested_after: float | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """(``_id``, ``_source``) of a job's training documents in the window, in step order; with
        ``ingested_after`` (unix seconds) only those indexed since then (``event.ingested``, which the
        ingest pipelines set): the training watch's later reads (anomaly/sdc_window.py)."""
        body: dict[str, Any] = {
            "_source": FIELDS,
            "query": {"bool": {"filter": self._filters(since, job, ingested_after)}},
            "sort": SORT,
        }
        found: list[tuple[str, dict[str, Any]]] = []
        try:
            for hits in sorted_pages(self._hits, body, self.page):
                found += [(str(hit.get("_id", "")), hit.get("_source", {})) for hit in hits]
                if len(found) >= self.max_records:
                    break
        except PagingError as exc:
            raise JobReadError(f"log store, job {job}: {exc}") from exc
        return found

    def _hits(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self._search(body).get("hits", {}).get("hits", [])
