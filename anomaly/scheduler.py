"""The scheduler's running jobs for the anomaly window, where a slurmrestd is configured: job id -> its
nodes, and whether the last read worked (the service's status says so). Its own module: the scheduler
is a second source beside Prometheus, with its own client, credentials and failure (a failed read is
no failed cycle: the series' ``hpc_job`` labels still say which GPUs run which job). The client and the
job shapes of every API version live in the core (fleetsight.slurmrest): the health service reads the
same slurmrestd.
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx

from fleetsight.slurmrest import SlurmRest, SlurmRestError, job_comment, running_jobs

from .declared import routing_comment_pattern


def slurm_client(url: str, timeout: float, socket: str | None = None) -> SlurmRest:
    """slurmrestd over TCP with a JWT (``SLURM_JWT``, rest_auth/jwt), or over its UNIX socket
    (rest_auth/local; ``socket`` or ``FLEETSIGHT_SLURM_SOCKET``), as the health service reaches it."""
    socket = socket or os.environ.get("FLEETSIGHT_SLURM_SOCKET") or None
    token = os.environ.get("SLURM_JWT")
    headers = {"X-SLURM-USER-TOKEN": token} if token else {}
    transport = httpx.HTTPTransport(uds=socket) if socket else None
    return SlurmRest(url, httpx.Client(timeout=timeout, headers=headers, transport=transport))


class SchedulerJobs:
    """Reads the running jobs from one slurmrestd; ``up`` and ``error`` say how the last read went,
    ``routing`` which of the jobs declare expert routing in their comment (anomaly/declared.py)."""

    def __init__(self, url: str, timeout: float, socket: str | None = None) -> None:
        self.rest = slurm_client(url, timeout, socket)
        self.routing_pattern = routing_comment_pattern()
        self.up: bool | None = None
        self.error = ""
        self.routing: frozenset[str] = frozenset()

    def close(self) -> None:
        self.rest.client.close()

    def read(self) -> dict[str, list[str]] | None:
        """Job id -> nodes of the running jobs; None when slurmrestd fails."""
        try:
            body = self.rest.json("jobs")
            jobs = running_jobs(body)
        except (httpx.HTTPError, SlurmRestError, ValueError, KeyError, TypeError) as exc:
            self.up = False
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        self.up = True
        self.error = ""
        self.routing = routing_jobs(body, self.routing_pattern, jobs)
        return jobs


def routing_jobs(
    body: dict[str, Any], pattern: re.Pattern[str], running: dict[str, list[str]]
) -> frozenset[str]:
    """The running jobs of a slurmrestd jobs answer whose comment matches ``pattern``."""
    return frozenset(
        str(job["job_id"])
        for job in body["jobs"]
        if str(job.get("job_id")) in running and pattern.search(job_comment(job))
    )
