"""A slurmrestd client that finds the API version the server speaks, and reads its job shapes.

slurmrestd serves one ``/slurm/v0.0.NN/...`` tree per loaded OpenAPI plugin and lists them in its own
OpenAPI document (``GET /openapi/v3``; also ``/openapi``, ``/openapi.json``). SchedMD's client guide
(slurm.schedmd.com/rest_clients.html) says to read that document rather than assume a version: each
release serves only a few (Debian 12's 22.05: v0.0.36-v0.0.38; 23.11: v0.0.37-v0.0.40; 24.11:
v0.0.40-v0.0.42), and an upgrade removes the oldest. So a URL may be:

- a base, ``http://slurmrestd:6820``: the newest version the server offers that FleetSight knows is
  found from the OpenAPI document, or, where that is not served (the twin), by trying the known
  versions newest first until one answers other than 404;
- a versioned base, ``http://slurmrestd:6820/slurm/v0.0.38``, or a resource URL as before,
  ``http://slurmrestd:6820/slurm/v0.0.40/jobs``: that version, pinned.

Job shapes differ by version in what FleetSight reads: ``job_state`` is a word up to v0.0.39 and a list
of words from v0.0.40; ``job_resources.nodes`` is a host list up to v0.0.40 and an object (``list``,
``allocation[].name``) from v0.0.41. The top-level ``nodes`` host list is in every version.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger("fleetsight.slurmrest")

# Newest first: the order discovery prefers and the fallback tries. v0.0.36-v0.0.38 are checked
# against Debian's real 22.05 slurmrestd, v0.0.40 against the twin (23.11's shapes); the others
# differ from those only in fields FleetSight does not read.
KNOWN_VERSIONS = tuple(f"v0.0.{n}" for n in range(44, 35, -1))
SPEC_PATHS = ("/openapi/v3", "/openapi")
# A server upgraded in place may drop the version found earlier: look again on a 404, at most this often.
REDISCOVER_S = 300.0
_VERSIONED = re.compile(r"^(?P<base>.*?)/slurm/(?P<version>v\d+\.\d+\.\d+)(?:/(?P<resource>.*))?$")
_IN_SPEC = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


class SlurmRestError(ValueError):
    """slurmrestd offers no API version FleetSight can use, or answered something unreadable (a
    ValueError: the callers that survive a bad answer already catch those)."""


@dataclass(frozen=True)
class SlurmUrl:
    """A configured URL split into the server's base, a pinned version (or None) and a resource."""

    base: str
    version: str | None = None
    resource: str | None = None

    @classmethod
    def parse(cls, url: str) -> SlurmUrl:
        url = url.rstrip("/")
        match = _VERSIONED.match(url)
        if not match:
            return cls(url)
        return cls(match["base"], match["version"], (match["resource"] or "").strip("/") or None)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def versions_offered(spec: dict[str, Any]) -> list[str]:
    """The ``slurm/v0.0.NN`` versions an OpenAPI document has paths for, newest first."""
    found = {m.group(1) for path in spec.get("paths") or {} if (m := _IN_SPEC.match(path))}
    return sorted(found, key=version_key, reverse=True)


def choose(offered: list[str]) -> str:
    """The newest offered version FleetSight knows; else the newest offered (its fields are read
    leniently, and an unknown newer one beats none)."""
    known = [v for v in offered if v in KNOWN_VERSIONS]
    if known:
        return known[0]
    if offered:
        log.warning("event=slurmrest_unknown_version offered=%s using=%s", ",".join(offered), offered[0])
        return offered[0]
    raise SlurmRestError("slurmrestd's OpenAPI document lists no /slurm/v0.0.NN paths")


class SlurmRest:
    """``get("jobs")`` on the version the server speaks. The httpx client carries the transport (TCP,
    or slurmrestd's UNIX socket) and the authentication headers (``X-SLURM-USER-TOKEN``)."""

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = SlurmUrl.parse(url)
        self.client = client
        self.version = self.url.version
        self.discovered_at = float("-inf")

    def resource_url(self, resource: str) -> str:
        """A pinned resource URL is used as given (backward compatible); otherwise base/version/resource."""
        if self.url.resource and self.url.version:
            return f"{self.url.base}/slurm/{self.url.version}/{self.url.resource}"
        return f"{self.url.base}/slurm/{self.version_for(resource)}/{resource}"

    def version_for(self, resource: str) -> str:
        if self.version is None:
            self.version = self.discover(resource)
        return self.version

    def get(self, resource: str) -> httpx.Response:
        """The server's answer for ``resource`` (``jobs``, ``nodes``); the caller checks its status."""
        response = self.client.get(self.resource_url(resource))
        if response.status_code == 404 and self._may_rediscover():
            # the version found earlier may be gone after an upgrade: find it again, once
            self.version = None
            response = self.client.get(self.resource_url(resource))
        return response

    def json(self, resource: str) -> dict[str, Any]:
        response = self.get(resource)
        response.raise_for_status()
        body = response.json()
        if not isinstance(body, dict):
            raise SlurmRestError(f"{response.url}: expected a JSON object, got {type(body).__name__}")
        return body

    def _may_rediscover(self) -> bool:
        return self.url.version is None and time.monotonic() - self.discovered_at >= REDISCOVER_S

    def discover(self, resource: str = "jobs") -> str:
        """The version to use: from the OpenAPI document, else the first known version that answers."""
        self.discovered_at = time.monotonic()
        spec = self._spec()
        version = choose(versions_offered(spec)) if spec is not None else self._probe(resource)
        log.info("event=slurmrest_version base=%s version=%s", self.url.base, version)
        return version

    def _spec(self) -> dict[str, Any] | None:
        """slurmrestd's OpenAPI document; None where it is not served (404), an error otherwise."""
        for path in SPEC_PATHS:
            response = self.client.get(f"{self.url.base}{path}")
            if response.status_code == 404:
                continue
            response.raise_for_status()
            try:
                spec = response.json()
            except ValueError:
                continue  # a proxy's page, not the document: try the next, then probe
            if isinstance(spec, dict) and versions_offered(spec):
                return spec
        return None

    def _probe(self, resource: str) -> str:
        for version in KNOWN_VERSIONS:
            response = self.client.get(f"{self.url.base}/slurm/{version}/{resource}")
            if response.status_code != 404:
                response.raise_for_status()
                return version
        raise SlurmRestError(
            f"{self.url.base}: no OpenAPI document and no known version ({KNOWN_VERSIONS[-1]}-"
            f"{KNOWN_VERSIONS[0]}) answers /slurm/v0.0.NN/{resource}"
        )


# ---------------------------------------------------------------------------------------- job shapes
_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``n[0001-0003,0007],gpu-a1``) as names."""
    names: list[str] = []
    for part in _split_top(text):
        if "[" not in part:
            names.append(part)
            continue
        prefix, rest = part.split("[", 1)
        body, _, suffix = rest.partition("]")
        for item in body.split(","):
            match = _RANGE.match(item)
            if match:
                first, last = match.groups()
                width = len(first)
                names.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(first), int(last) + 1))
            elif item:
                names.append(f"{prefix}{item}{suffix}")
    return names


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def job_states(job: dict[str, Any]) -> list[str]:
    """``"RUNNING"`` (up to v0.0.39) or ``["RUNNING", "COMPLETING"]`` (v0.0.40+) as upper-case words."""
    state = job.get("job_state") or []
    return [str(s).upper() for s in ([state] if isinstance(state, str) else state)]


def job_nodes(job: dict[str, Any]) -> list[str]:
    """A job's nodes: the top-level host list (every version), else ``job_resources``'s."""
    if isinstance(job.get("nodes"), str) and job["nodes"]:
        return expand_hostlist(job["nodes"])
    resources = job.get("job_resources") or {}
    nodes = resources.get("nodes")
    if isinstance(nodes, str):  # up to v0.0.40: a host list, plus allocated_nodes
        return expand_hostlist(nodes) or _allocated_names(resources.get("allocated_nodes"))
    if isinstance(nodes, dict):  # v0.0.41+: {"list": host list, "allocation": [{"name": ...}]}
        return expand_hostlist(str(nodes.get("list") or "")) or [
            n["name"] for n in nodes.get("allocation") or []
        ]
    return []


def _allocated_names(allocated: Any) -> list[str]:
    """v0.0.38-v0.0.40: a list of {"nodename": ...}; v0.0.36/37: {"0": {...}} by index, without names."""
    if not isinstance(allocated, list):
        return []
    return [str(n["nodename"]) for n in allocated if isinstance(n, dict) and n.get("nodename")]


def job_comment(job: dict[str, Any]) -> str:
    """The submitter's comment (``sbatch --comment``): a string in every version FleetSight reads;
    an object of strings is read too, should a version group its comments."""
    comment = job.get("comment")
    if isinstance(comment, dict):
        return " ".join(str(v) for v in comment.values() if isinstance(v, str))
    return comment if isinstance(comment, str) else ""


def running_jobs(body: dict[str, Any]) -> dict[str, list[str]]:
    """Job id -> nodes of the RUNNING jobs of a slurmrestd ``GET /slurm/v0.0.NN/jobs`` answer."""
    out: dict[str, list[str]] = {}
    for job in body["jobs"]:
        nodes = job_nodes(job)
        if "RUNNING" in job_states(job) and nodes:
            out[str(job["job_id"])] = nodes
    return out
