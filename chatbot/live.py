"""Live context: the nodes and jobs a question names, and what the cluster says about them right now.

Sources (each optional, each reached over HTTP as in production):

- health service ``GET {health}/v1/nodes/{node}`` ->
  ``{"node", "state", "since", "reasons": [{"signal", "source", "since", "summary", "runbook", "evidence"}]}``
- health service ``GET {health}/v1/jobs/{job}/faults`` -> ``{"faults": [{"alertname", "nodes",
  "summary", "runbook", "active", "first_seen", "last_seen", ...}]}`` (404: no such job in the window)
- anomaly service ``GET {anomaly}/v1/jobs/{job}/stragglers`` ->
  ``{"hpc_job", "stragglers": [{"node", "cause", "gpu", "score", "since" (ISO), "evidence"}]}``
  (404: the job is not running)
- log search (OpenSearch/Elasticsearch) ``POST {logs}/fleetsight-logs-*/_search``: the node's newest
  error-level events and Xids of the last day (``host.name``, ``log.level``, ``nvidia.xid.code``,
  ``message``).

A source that does not answer is reported in ``notes`` ("health service unreachable ..."); the answer
still comes from the runbooks.
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

# Node names as clusters spell them: the twin's n0007, gpu-node-07, dgx-a100-012, node12 ... Anything
# after the word "node"/"host" that carries a digit counts too ("on node r12c3").
DEFAULT_NODE_PATTERN = (
    r"\b(?:n\d{3,6}|(?:[a-z][a-z0-9]*-)+\d{1,6}|(?:node|host|dgx|gpu)\d{1,6})\b"
    r"|(?<=\bnode )[a-z0-9][a-z0-9-]*\d[a-z0-9-]*\b|(?<=\bhost )[a-z0-9][a-z0-9-]*\d[a-z0-9-]*\b"
)
# A Slurm id (4711, an array task 12345_7) or a Kubernetes one, <namespace>/<name> as the anomaly
# service names it (namespace and name are DNS labels), after the word "job".
JOB_PATTERN = re.compile(
    r"\bjob(?:[ _-]?id)?\s*(?:#|:|=|no\.?|number)?\s*"
    r"(\d{1,12}(?:_\d+)?|[a-z0-9](?:[a-z0-9-]{0,62})/[a-z0-9](?:[a-z0-9.-]{0,252}[a-z0-9])?)(?![\w/-])",
    re.IGNORECASE,
)
MAX_FAULTS = 5  # a job's faults shown as evidence, active ones first
# Words that look like node names but are not (hardware and software names with digits).
NOT_NODES = re.compile(
    r"^(?:xid|sxid|gen|pcie|x|hdr|ndr|h|a|b|sm|fp|bf|int|cuda|nccl|psu|gpu|port|step)-?\d+$"
)
MAX_NODES = 4
# How the service's metrics and the evidence name each source.
SOURCE_LABELS = {"health service": "health", "anomaly service": "anomaly", "log search": "logs"}
LOG_INDEX = "fleetsight-logs-*"


@dataclass
class Evidence:
    """One fact from a live source, cited with where it came from and when."""

    source: str  # "health", "anomaly" or "logs"
    url: str
    subject: str  # the node or job it is about
    summary: str
    time: str | None = None
    runbook: str | None = None  # a runbook the source itself names (health reasons do)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "url": self.url,
            "subject": self.subject,
            "summary": self.summary,
            "time": self.time,
            "runbook": self.runbook,
        }


@dataclass
class LiveContext:
    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # sources that did not answer usably ("health", ...)

    @property
    def runbooks(self) -> list[str]:
        """Runbooks the live sources point at: the node's own reasons (the cause: PSUFailed) before the
        job's (the symptom: StragglerNode)."""
        seen: dict[str, None] = {}
        for item in sorted(self.evidence, key=lambda e: e.source != "health"):
            if item.runbook:
                seen[item.runbook] = None
        return list(seen)


@dataclass(frozen=True)
class LiveSources:
    health_url: str | None = None
    anomaly_url: str | None = None
    logs_url: str | None = None
    health_token: str | None = field(default=None, repr=False)  # never in a repr or a log line
    # The log search's login (Elasticsearch with security on: a read-only user) and its CA file.
    logs_login: tuple[str, str] | None = field(default=None, repr=False)
    logs_ca_file: str | None = None
    timeout_s: float = 1.5
    node_pattern: str = DEFAULT_NODE_PATTERN

    @property
    def any(self) -> bool:
        return bool(self.health_url or self.anomaly_url or self.logs_url)


@functools.cache
def shared_client(timeout_s: float, ca_file: str | None = None) -> httpx.Client:
    """One client for all questions: building one loads the TLS trust store (~0.5 s on a busy host),
    far more than the look-ups themselves. httpx clients are safe to share between threads. With
    ca_file, servers are verified against that CA (a private one, as the stack's Elasticsearch has)."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    return httpx.Client(timeout=timeout_s, follow_redirects=False, verify=verify)


def find_jobs(question: str) -> list[str]:
    return list(dict.fromkeys(JOB_PATTERN.findall(question)))


def find_nodes(question: str, pattern: str = DEFAULT_NODE_PATTERN) -> list[str]:
    found = [m.group(0) for m in re.finditer(pattern, question.lower())]
    return [n for n in dict.fromkeys(found) if not NOT_NODES.match(n)][:MAX_NODES]


def _unreachable(what: str, url: str, exc: Exception) -> str:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
    return f"{what} {kind} at {url} ({type(exc).__name__}): live state not included"


def node_health(client: httpx.Client, sources: LiveSources, node: str, context: LiveContext) -> None:
    url = f"{sources.health_url}/v1/nodes/{quote(node, safe='')}"
    headers = {"Authorization": f"Bearer {sources.health_token}"} if sources.health_token else {}
    response = client.get(url, headers=headers)
    if response.status_code == 404:
        context.notes.append(f"health service does not know node {node}")
        return
    if response.status_code in (401, 403):
        context.notes.append(
            f"health service refused the read (HTTP {response.status_code}): give the chatbot a token "
            "with scope read in FLEETSIGHT_CHATBOT_HEALTH_TOKEN"
        )
        return
    if not response.is_success:
        said = _detail(response)
        context.notes.append(f"health service answered HTTP {response.status_code} for node {node}{said}")
        return
    body = response.json()
    note_missing_clusters(body, context)
    for item in answers_of(body):
        node_evidence(url, node, item, context)


def node_evidence(url: str, node: str, item: dict[str, Any], context: LiveContext) -> None:
    """One node record as evidence: its state, and each reason with its runbook; the cluster named
    when the record says it (several clusters may have a node of that name)."""
    state, name = item.get("state", "unknown"), f"{node}{where(item)}"
    reasons = [r for r in item.get("reasons", []) if isinstance(r, dict) and not r.get("cleared_at")]
    if not reasons:
        context.evidence.append(Evidence("health", url, node, f"{name} is {state}", item.get("since")))
    for reason in reasons:
        summary = reason.get("summary") or reason.get("signal", "?")
        runbook = reason.get("runbook") or None
        context.evidence.append(
            Evidence("health", url, node, f"{name} is {state}: {summary}", reason.get("since"), runbook)
        )


def answers_of(body: Any) -> list[dict[str, Any]]:
    """A health service's answer, or the global layer's (docs/fleet.md: ``matches``, one per cluster
    that has the node or the job)."""
    if not isinstance(body, dict):  # a proxy or an older API: reported as unreadable, never guessed at
        raise TypeError(f"expected a JSON object, got {type(body).__name__}")
    matches = body.get("matches")
    if matches is None:
        return [body]
    if not isinstance(matches, list) or not all(isinstance(m, dict) for m in matches):
        raise TypeError("`matches` is not a list of objects")
    return matches


def where(item: dict[str, Any]) -> str:
    cluster = item.get("cluster")
    return f" (cluster {cluster})" if cluster else ""


def note_missing_clusters(body: Any, context: LiveContext) -> None:
    """The global layer's clusters that did not answer: the live state may be incomplete, said so."""
    for gap in body.get("missing", []) if isinstance(body, dict) else []:
        if isinstance(gap, dict):
            context.notes.append(
                f"cluster {gap.get('cluster', '?')} did not answer the global layer ({gap.get('error', '')})"
            )


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return ""
    return f": {detail}" if isinstance(detail, str) and detail else ""


def job_stragglers(client: httpx.Client, sources: LiveSources, job: str, context: LiveContext) -> list[str]:
    """Adds the job's stragglers as evidence; returns their nodes."""
    url = f"{sources.anomaly_url}/v1/jobs/{quote(job, safe='')}/stragglers"
    response = client.get(url)
    if response.status_code == 404:
        context.notes.append(f"anomaly service: job {job} is not running (no recent data)")
        return []
    if not response.is_success:
        context.notes.append(f"anomaly service answered HTTP {response.status_code} for job {job}")
        return []
    stragglers = response.json().get("stragglers", [])
    if not stragglers:
        context.evidence.append(Evidence("anomaly", url, f"job {job}", f"job {job}: no straggler flagged"))
    nodes = []
    for item in stragglers:
        node = str(item.get("node", "?"))
        cause = str(item.get("cause", "unknown")).replace("_", " ")
        gpu = f" GPU {item['gpu']}" if item.get("gpu") is not None else ""
        summary = f"job {job}: node {node}{gpu} is flagged as a straggler (cause: {cause})"
        context.evidence.append(
            Evidence(
                "anomaly",
                url,
                f"job {job}",
                summary,
                str(item.get("since")),
                "docs/runbooks/StragglerNode.md",
            )
        )
        nodes.append(node)
    return nodes


def job_faults(client: httpx.Client, sources: LiveSources, job: str, context: LiveContext) -> list[str]:
    """Adds the faults that touched the job (the health service's job faults) as evidence, each with
    the runbook its alert names; returns the nodes of the active ones."""
    url = f"{sources.health_url}/v1/jobs/{quote(job, safe='')}/faults"
    headers = {"Authorization": f"Bearer {sources.health_token}"} if sources.health_token else {}
    response = client.get(url, headers=headers)
    if response.status_code == 404:
        context.notes.append(f"health service: no job {job} in its window")
        return []
    if not response.is_success:
        said = _detail(response)
        context.notes.append(
            f"health service answered HTTP {response.status_code} for job {job}'s faults{said}"
        )
        return []
    body = response.json()
    note_missing_clusters(body, context)
    active: list[str] = []
    for answer in answers_of(body):
        active += faults_evidence(url, job, answer, context)
    return active


def faults_evidence(url: str, job: str, answer: dict[str, Any], context: LiveContext) -> list[str]:
    """One cluster's job faults as evidence (the cluster named when the answer says it); returns the
    nodes of the active ones."""
    subject = f"job {job}{where(answer)}"
    faults = sorted(answer.get("faults", []), key=lambda f: not f.get("active"))
    if not faults:
        window = answer.get("window", "")
        context.evidence.append(
            Evidence("health", url, f"job {job}", f"{subject}: no fault in the last {window}")
        )
    for fault in faults[:MAX_FAULTS]:
        context.evidence.append(fault_evidence(url, job, fault, where(answer)))
    return [n for f in faults if f.get("active") for n in f.get("nodes", [])]


def fault_evidence(url: str, job: str, fault: dict[str, Any], cluster: str = "") -> Evidence:
    """``cluster``: " (cluster <name>)" where the answer names one, else empty."""
    when = "firing" if fault.get("active") else f"resolved {fault.get('last_seen')}"
    summary = f"job {job}{cluster}: {fault.get('summary') or fault.get('alertname')} ({when})"
    runbook = str(fault.get("runbook") or "") or None
    return Evidence("health", url, f"job {job}", summary, fault.get("first_seen"), runbook)


def log_query(node: str) -> dict[str, Any]:
    return {
        "size": 5,
        "sort": [{"@timestamp": {"order": "desc"}}],
        "query": {
            "bool": {
                "filter": [
                    {"range": {"@timestamp": {"gte": "now-24h"}}},
                    {"term": {"host.name": node}},
                ],
                "should": [
                    {"terms": {"log.level": ["error", "critical"]}},
                    {"exists": {"field": "nvidia.xid.code"}},
                ],
                "minimum_should_match": 1,
            }
        },
    }


def log_line(source: dict[str, Any]) -> str:
    xid = source.get("nvidia", {}).get("xid") if isinstance(source.get("nvidia"), dict) else None
    if isinstance(xid, dict) and "code" in xid:
        return f"Xid {xid['code']}: {xid.get('message') or source.get('message', '')}".strip()
    return str(source.get("message", ""))[:300]


def node_logs(client: httpx.Client, sources: LiveSources, node: str, context: LiveContext) -> None:
    url = f"{sources.logs_url}/{LOG_INDEX}/_search"
    if sources.logs_ca_file:
        client = shared_client(sources.timeout_s, sources.logs_ca_file)
    params = {"ignore_unavailable": "true", "allow_no_indices": "true"}
    response = client.post(url, params=params, json=log_query(node), auth=sources.logs_login)
    if response.status_code in (401, 403):
        context.notes.append(
            f"log search refused the chatbot's login (HTTP {response.status_code}): set "
            "FLEETSIGHT_CHATBOT_LOGS_USER and _PASSWORD_FILE to a user with read access to the log indices"
        )
        return
    if not response.is_success:
        context.notes.append(f"log search answered HTTP {response.status_code} for node {node}")
        return
    for hit in response.json().get("hits", {}).get("hits", []):
        source = hit.get("_source", {})
        context.evidence.append(
            Evidence("logs", url, node, f"{node}: {log_line(source)}", source.get("@timestamp"))
        )


def gather(question: str, sources: LiveSources) -> LiveContext:
    """The live context of a question: its jobs' stragglers, then its nodes' health and recent errors."""
    context = LiveContext(jobs=find_jobs(question), nodes=find_nodes(question, sources.node_pattern))
    if not (context.jobs or context.nodes):
        return context
    if not sources.any:
        context.notes.append("no live sources configured: answered from the runbooks only")
        return context
    down: set[str] = set()  # a source that failed once is not asked again for this question

    def ask(name: str, base: str | None, call: Callable[[], Any]) -> Any:
        if not base or name in down:
            return None
        try:
            return call()
        except httpx.HTTPError as exc:
            down.add(name)
            context.failed.append(SOURCE_LABELS[name])
            context.notes.append(_unreachable(name, base, exc))
        except (ValueError, AttributeError, TypeError, KeyError) as exc:  # not the JSON we expect
            down.add(name)
            context.failed.append(SOURCE_LABELS[name])
            context.notes.append(f"{name} at {base} answered something unreadable ({type(exc).__name__})")
        return None

    client = shared_client(sources.timeout_s)
    for job in context.jobs:
        hit = ask("health service", sources.health_url, lambda: job_faults(client, sources, job, context))  # noqa: B023
        for node in hit or []:
            if node not in context.nodes:
                context.nodes.append(node)
        flagged = ask(
            "anomaly service",
            sources.anomaly_url,
            lambda: job_stragglers(client, sources, job, context),  # noqa: B023 - called at once
        )
        for node in flagged or []:
            if node not in context.nodes:
                context.nodes.append(node)
    for node in context.nodes[:MAX_NODES]:
        # Both lambdas are called at once, inside this iteration.
        ask("health service", sources.health_url, lambda: node_health(client, sources, node, context))  # noqa: B023
        ask("log search", sources.logs_url, lambda: node_logs(client, sources, node, context))  # noqa: B023
    return context
