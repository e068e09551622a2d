"""``fleetsight logs search``: simple questions answered from the terminal (the Xids of a node in the last
day; the errors of job X), as one query against the log indices."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .apply import SearchServer
from .logclasses import OPERATIONAL_INDICES

ERROR_LEVELS = ("error", "critical")
DURATION = re.compile(r"^(\d+)([smhd])$")


@dataclass
class Question:
    node: str | None = None
    job: str | None = None
    actions: list[str] = field(default_factory=list)
    errors_only: bool = False
    since: str = "24h"
    text: str | None = None
    log_class: str | None = None
    limit: int = 50


def es_duration(text: str) -> str:
    """``24h``, ``30m``, ``7d`` -> the same, checked (date math takes them as they are)."""
    if not DURATION.match(text):
        raise ValueError(f"--since {text!r}: use a number and a unit s, m, h or d (e.g. 24h, 30m, 7d)")
    return text


def build_query(question: Question) -> dict[str, Any]:
    filters: list[dict[str, Any]] = [{"range": {"@timestamp": {"gte": f"now-{es_duration(question.since)}"}}}]
    if question.node:
        filters.append({"term": {"host.name": question.node}})
    if question.job:
        filters.append({"term": {"fleetsight.hpc_job": question.job}})
    if question.actions:
        filters.append({"terms": {"event.action": question.actions}})
    if question.errors_only:
        filters.append({"terms": {"log.level": list(ERROR_LEVELS)}})
    if question.log_class:
        filters.append({"term": {"fleetsight.log_class": question.log_class}})
    must = [{"query_string": {"query": question.text, "default_field": "message"}}] if question.text else []
    return {
        "size": question.limit,
        "sort": [{"@timestamp": {"order": "desc"}}],
        "track_total_hits": True,
        "query": {"bool": {"filter": filters, "must": must}},
    }


def run(url: str, question: Question) -> tuple[int, list[dict[str, Any]]]:
    """(total hits, the newest ``limit`` documents' sources)."""
    server = SearchServer(url)
    response = server.request(
        "POST",
        f"/{OPERATIONAL_INDICES}/_search?ignore_unavailable=true&allow_no_indices=true",
        build_query(question),
    )
    hits = response.json()["hits"]
    return hits["total"]["value"], [hit["_source"] for hit in hits["hits"]]


def summary(source: dict[str, Any]) -> str:
    """One readable line per event: the fields that matter for its kind, else the raw line."""
    nvidia = source.get("nvidia", {})
    if "xid" in nvidia:
        xid = nvidia["xid"]
        who = f" pid {xid['pid']} ({xid.get('process', '?')})" if "pid" in xid else ""
        return (
            f"Xid {xid.get('code')} on {xid.get('pci_bdf')}{who}: "
            f"{xid.get('category')} -> {xid.get('action')}; {xid.get('message', '')}"
        )
    if "sxid" in nvidia:
        sxid = nvidia["sxid"]
        where = f"switch {sxid.get('switch')} {sxid.get('pci_bdf')}"
        return f"SXid {sxid.get('code')} {where}: {sxid.get('message')}"
    if "training" in source:
        training = source["training"]
        loss = training.get("loss", training.get("loss_text"))
        return f"step {training.get('step')} loss {loss} step time {training.get('step_time_ms')} ms"
    if "cuda" in source:
        return f"CUDA error: {source['cuda'].get('error')}"
    if "nccl" in source and "timeout_ms" in source["nccl"]:
        nccl = source["nccl"]
        return f"NCCL {nccl.get('op')} seq {nccl.get('seq')} timed out after {nccl.get('timeout_ms')} ms"
    return str(source.get("message", ""))
