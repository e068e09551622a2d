#!/usr/bin/env python3
"""Slurm Prolog / HealthCheckProgram and LSF pre-exec: ask the FleetSight health service whether this
node (or a job's nodes) is fit, with a timeout, and fail open or closed when the service does not answer.

Standard library only, so it runs from any python3 on a compute node:

    Prolog=/opt/fleetsight/prolog.py              (slurm.conf; SLURMD_NODENAME names the node)
    HealthCheckProgram=/opt/fleetsight/prolog.py  (add --drain: it drains the node itself if unfit)
    PRE_EXEC=/opt/fleetsight/prolog.py            (LSF: LSB_HOSTS / LSB_MCPU_HOSTS name the hosts)

Configuration by environment (or options): FLEETSIGHT_HEALTH_URL, FLEETSIGHT_HEALTH_TIMEOUT (seconds),
FLEETSIGHT_HEALTH_FAIL (open|closed), FLEETSIGHT_HEALTH_TOKEN (when reads need a token).
Exit status: 0 fit (or service unreachable and fail=open), 1 unfit, 2 unreachable and fail=closed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request


def job_nodes(environ: dict[str, str]) -> list[str]:
    if environ.get("SLURMD_NODENAME"):
        return [environ["SLURMD_NODENAME"]]
    if environ.get("LSB_HOSTS"):
        return sorted(set(environ["LSB_HOSTS"].split()))
    if environ.get("LSB_MCPU_HOSTS"):
        return sorted(set(environ["LSB_MCPU_HOSTS"].split()[0::2]))
    return [socket.gethostname().split(".")[0]]


def ask(url: str, nodes: list[str], timeout: float, token: str | None) -> dict:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/preflight",
        data=json.dumps({"nodes": nodes}).encode(),
        headers={
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    env = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default=env.get("FLEETSIGHT_HEALTH_URL", "http://127.0.0.1:19141"))
    parser.add_argument("--timeout", type=float, default=float(env.get("FLEETSIGHT_HEALTH_TIMEOUT", "3")))
    parser.add_argument(
        "--fail", choices=("open", "closed"), default=env.get("FLEETSIGHT_HEALTH_FAIL", "open")
    )
    parser.add_argument("--drain", action="store_true", help="HealthCheckProgram: drain this node if unfit")
    parser.add_argument("nodes", nargs="*", help="Nodes to check (default: from the scheduler's environment)")
    args = parser.parse_args(argv)
    nodes = args.nodes or job_nodes(env)
    try:
        answer = ask(args.url, nodes, args.timeout, env.get("FLEETSIGHT_HEALTH_TOKEN"))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        verdict = "allowing" if args.fail == "open" else "refusing"
        print(
            f"fleetsight-preflight: health service unreachable ({exc}); fail-{args.fail}: {verdict}",
            file=sys.stderr,
        )
        return 0 if args.fail == "open" else 2
    for item in answer.get("unfit", []):
        why = "; ".join(item.get("reasons", [])) or item.get("state", "")
        print(f"fleetsight-preflight: {item['node']} is {item['state']}: {why}", file=sys.stderr)
        if args.drain:
            reason = f"fleetsight: preflight {item['state']}: {why}"[:200]
            subprocess.run(
                ["scontrol", "update", f"nodename={item['node']}", "state=drain", f"reason={reason}"],
                check=False,
                timeout=30,
            )
    return 0 if answer.get("ok", False) else 1


if __name__ == "__main__":
    sys.exit(main())
