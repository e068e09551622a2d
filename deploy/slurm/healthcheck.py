#!/usr/bin/env python3
"""Slurm HealthCheckProgram for FleetSight (slurm.conf, NHC's place):

    HealthCheckProgram=/usr/lib/fleetsight/slurm/healthcheck
    HealthCheckInterval=300
    HealthCheckNodeState=ANY

slurmd runs it as root on every node, without arguments. It asks the FleetSight health service whether
this node is fit (POST /v1/preflight) and, when it is not, drains the node with the service's reason
(``fleetsight: healthcheck: <state>: <reasons>``). When the service says fit again it resumes the node,
but only while Slurm still shows that reason: an operator's drain (or re-drain) is never lifted. A node
the service does not know yet is reported, not drained.

When the health service does not answer, FleetSight is down, not the node: it never drains then. It
reads the node agent's own /metrics instead and reports what the local checks find (syslog, stderr and
the optional log file), with the reason the service was not asked; ``--local-drain`` (or
FLEETSIGHT_LOCAL_DRAIN=1) lets a hard local failure drain the node (reason ``fleetsight-local: ...``,
never resumed automatically).

The node agent behind its web configuration (TLS + basic auth, as the fleetsight-node package
installs it): FLEETSIGHT_AGENT_URL=https://127.0.0.1:9401/metrics, the password of the scrape user
(FLEETSIGHT_AGENT_USER, default prometheus) in FLEETSIGHT_AGENT_PASSWORD_FILE, its certificate checked
against FLEETSIGHT_AGENT_CA_FILE for the name FLEETSIGHT_AGENT_SERVER_NAME (the name it is issued for,
fleetsight-exporter, rather than the loopback address dialled). Unset: plain http, no auth.

Standard library only. Settings: /etc/fleetsight/healthcheck.env (KEY=VALUE lines), then the environment,
then options: FLEETSIGHT_HEALTH_URL, FLEETSIGHT_HEALTH_TOKEN, FLEETSIGHT_HEALTH_TIMEOUT,
FLEETSIGHT_AGENT_URL, FLEETSIGHT_AGENT_USER, FLEETSIGHT_AGENT_PASSWORD_FILE, FLEETSIGHT_AGENT_CA_FILE,
FLEETSIGHT_AGENT_SERVER_NAME, FLEETSIGHT_HEALTHCHECK_LOG, FLEETSIGHT_LOCAL_DRAIN.

Example (by hand, nothing changed): healthcheck.py --dry-run --node n0001
Exit status: 0 fit (or not asked), 1 unfit (drained unless --dry-run), 64 bad usage.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONFIG = "/etc/fleetsight/healthcheck.env"
# Local checks: a series with this value means the node is not fit. The node agent's own signals, so
# that they hold while the central stack is away (metric names: exporters/).
LOCAL_RULES = (
    ("fleetsight_pcie_link_downgraded", 1.0, "PCIe link downgraded"),
    ("fleetsight_infiniband_port_up", 0.0, "InfiniBand port down"),
    ("fleetsight_bmc_psu_healthy", 0.0, "power supply unhealthy"),
    ("fleetsight_bmc_psu_redundancy_ok", 0.0, "power supply redundancy lost"),
)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def read_env_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key.strip()] = value.strip().strip('"')
    return values


def local_failures(metrics_text: str) -> list[str]:
    """What the node agent's metrics say is broken here, one phrase per failing series."""
    failures = []
    for line in metrics_text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        for metric, bad, what in LOCAL_RULES:
            if name == metric and float(value) == bad:
                failures.append(f"{what} {labels or ''}".strip())
    return failures


def ask_service(url: str, node: str, timeout: float, token: str | None) -> dict:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/preflight",
        data=json.dumps({"nodes": [node]}).encode(),
        headers={"Content-Type": "application/json", **auth},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


@dataclass(frozen=True)
class AgentAccess:
    """How to read the node agent: its URL and, behind its web configuration, the credentials."""

    url: str
    user: str = "prometheus"
    password_file: str | None = None
    ca_file: str | None = None  # None: the system's CAs
    server_name: str | None = None  # None: the URL's host


class AgentConnection(http.client.HTTPConnection):
    """HTTPS whose certificate check asks for server_name, not for the address dialled (127.0.0.1):
    the fleet's shared certificate names fleetsight-exporter only."""

    def __init__(
        self, host: str, port: int, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self.context, self.server_name = context, server_name

    def connect(self) -> None:
        super().connect()
        self.sock = self.context.wrap_socket(self.sock, server_hostname=self.server_name)


def read_agent(access: AgentAccess, timeout: float) -> str:
    """The agent's metrics page; OSError (HTTP errors, TLS, an unreadable password file) when unread."""
    url = urllib.parse.urlsplit(access.url)
    host = url.hostname or "127.0.0.1"
    headers = {}
    if access.password_file:
        password = Path(access.password_file).read_text().strip()
        headers["Authorization"] = "Basic " + base64.b64encode(f"{access.user}:{password}".encode()).decode()
    if url.scheme == "https":
        context = ssl.create_default_context(cafile=access.ca_file)
        name = access.server_name or host
        connection = AgentConnection(host, url.port or 443, timeout, context, name)
    else:
        connection = http.client.HTTPConnection(host, url.port or 80, timeout=timeout)
    try:
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {response.reason} from {access.url}")
        return response.read().decode(errors="replace")
    except http.client.HTTPException as exc:  # not HTTP at all (a TLS port read as plain http)
        raise OSError(f"{type(exc).__name__} from {access.url}: {exc}") from exc
    finally:
        connection.close()


OUR_PREFIX = "fleetsight: healthcheck:"


def slurm_reason(node: str) -> str:
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%E"], capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def resume_ours(node: str, dry_run: bool) -> str:
    """Lift this program's own drain (Slurm still shows its reason); anything else stays."""
    if not slurm_reason(node).startswith(OUR_PREFIX):
        return ""
    if dry_run:
        return "; would resume (our drain)"
    command = ["scontrol", "update", f"nodename={node}", "state=resume"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    return "; resumed (our drain)" if result.returncode == 0 else f"; resume failed: {result.stderr.strip()}"


def drain(node: str, reason: str, dry_run: bool) -> str:
    command = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason[:200]}"]
    if dry_run:
        return "would drain"
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    return "drained" if result.returncode == 0 else f"drain failed: {result.stderr.strip()}"


def report(message: str, log_file: str | None) -> None:
    line = f"fleetsight-healthcheck: {message}"
    print(line, file=sys.stderr)
    try:
        import syslog

        syslog.openlog("fleetsight-healthcheck", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, message)
    except (ImportError, OSError):
        pass
    if log_file:
        with open(log_file, "a") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def settings(argv: list[str] | None, environ: dict[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=environ.get("FLEETSIGHT_HEALTHCHECK_CONFIG", DEFAULT_CONFIG))
    parser.add_argument(
        "--node", help="This node's Slurm name (default: SLURMD_NODENAME, else the host name)"
    )
    parser.add_argument("--dry-run", action="store_true", help="Report; drain nothing")
    parser.add_argument("--local-drain", action="store_true", help="Drain on a hard local failure too")
    args = parser.parse_args(argv)
    env = {**read_env_file(Path(args.config)), **environ}
    args.url = env.get("FLEETSIGHT_HEALTH_URL", "http://127.0.0.1:9441")
    args.token = env.get("FLEETSIGHT_HEALTH_TOKEN") or None
    args.timeout = float(env.get("FLEETSIGHT_HEALTH_TIMEOUT", "5"))
    args.agent = AgentAccess(
        env.get("FLEETSIGHT_AGENT_URL", "http://127.0.0.1:9401/metrics"),
        env.get("FLEETSIGHT_AGENT_USER") or "prometheus",
        env.get("FLEETSIGHT_AGENT_PASSWORD_FILE") or None,
        env.get("FLEETSIGHT_AGENT_CA_FILE") or None,
        env.get("FLEETSIGHT_AGENT_SERVER_NAME") or None,
    )
    args.log_file = env.get("FLEETSIGHT_HEALTHCHECK_LOG") or None
    args.local_drain = args.local_drain or env.get("FLEETSIGHT_LOCAL_DRAIN") == "1"
    args.node = args.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return args


def fallback(args: argparse.Namespace, why: str) -> int:
    """The health service is down: local checks only, and FleetSight's outage never drains."""
    prefix = f"{args.node}: health service unreachable ({why}); not draining for FleetSight's outage"
    try:
        failures = local_failures(read_agent(args.agent, args.timeout))
    except (OSError, ValueError) as exc:
        report(f"{prefix}; node agent unreachable too ({exc}): no check ran", args.log_file)
        return 0
    if not failures:
        report(f"{prefix}; local checks passed ({args.agent.url})", args.log_file)
        return 0
    found = "; ".join(failures)
    if not args.local_drain:
        report(f"{prefix}; local checks found: {found} (report only)", args.log_file)
        return 0
    done = drain(args.node, f"fleetsight-local: {found}", args.dry_run)
    report(f"{prefix}; local checks found: {found}: {done}", args.log_file)
    return 1


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    args = settings(argv, dict(os.environ if environ is None else environ))
    try:
        answer = ask_service(args.url, args.node, args.timeout, args.token)
    except urllib.error.HTTPError as exc:  # the service answered, but not with a verdict (auth, 5xx)
        return fallback(args, f"HTTP {exc.code} from {args.url}")
    except (OSError, ValueError) as exc:
        return fallback(args, f"{type(exc).__name__}: {exc}")
    unfit = [item for item in answer.get("unfit", []) if item.get("node") == args.node]
    if not unfit:
        report(f"{args.node}: fit per {args.url}{resume_ours(args.node, args.dry_run)}", args.log_file)
        return 0
    item = unfit[0]
    if item.get("state") == "unknown":  # FleetSight has not seen this node yet: its gap, not the node's
        report(f"{args.node}: unknown to {args.url}; not draining", args.log_file)
        return 0
    current = slurm_reason(args.node)
    if current not in ("", "none") and not current.startswith(OUR_PREFIX):
        # drained (or down) with someone else's reason: theirs stays, and so does their state
        report(
            f"{args.node}: {item.get('state')} per {args.url}; Slurm already says {current!r}", args.log_file
        )
        return 1
    why = "; ".join(item.get("reasons") or []) or "no reason given"
    reason = f"{OUR_PREFIX} {item.get('state', 'unfit')}: {why}"
    report(f"{args.node}: {reason}: {drain(args.node, reason, args.dry_run)}", args.log_file)
    return 1


if __name__ == "__main__":
    sys.exit(main())
