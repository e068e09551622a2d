"""Apply the health service's drain list to the scheduler, touching only what FleetSight drained.

Slurm: ``scontrol update nodename=N state=drain reason="fleetsight: ..."`` and ``state=resume``; the
current state and reason come from ``sinfo``. A node is resumed only when FleetSight's ledger (a JSON
file) says it drained it AND Slurm still shows FleetSight's reason: a node an operator drained, or
re-drained with their own reason, is never resumed.

LSF: ``badmin hclose -C "fleetsight: ..."`` and ``badmin hopen``, with the same ledger.

Both write in batches: one command for every node that gets the same reason (``nodename=a,b,c``,
``hclose -C R a b c``; at most BATCH nodes a command), so a burst of drains costs the scheduler a few
calls, not one per node, and the ledger is saved once per command.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .model import OUR_REASON_PREFIX

BATCH = 500  # nodes per scheduler command (argument lists stay far below ARG_MAX)


class SyncError(RuntimeError):
    """The service or the scheduler could not be read; nothing was changed."""


@dataclass
class Plan:
    drain: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)
    resume: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (node, why)
    commands: list[list[str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "drain": [{"node": n, "reason": r} for n, r in self.drain],
            "resume": self.resume,
            "skipped": [{"node": n, "why": w} for n, w in self.skipped],
            "commands": [shlex.join(c) for c in self.commands],
        }


def fetch_drain_list(url: str, timeout: float, token: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/v1/drain-list", timeout=timeout, headers=headers)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise SyncError(f"cannot read the drain list from {url}: {exc}") from exc
    return {item["node"]: item["reason"] for item in response.json()["nodes"]}


class Ledger:
    """The nodes this sync drained, persisted so a restart never forgets (or invents) one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.nodes: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.nodes, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def run(command: list[str]) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SyncError(f"`{shlex.join(command)}` failed: {exc}") from exc
    if result.returncode != 0:
        raise SyncError(f"`{shlex.join(command)}` exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def batches(items: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """(node, reason) pairs -> (reason, nodes) groups of at most BATCH nodes, in reason then node order."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in sorted(items, key=lambda item: (item[1], item[0])):
        by_reason.setdefault(reason, []).append(node)
    return [
        (reason, nodes[start : start + BATCH])
        for reason, nodes in by_reason.items()
        for start in range(0, len(nodes), BATCH)
    ]


def scontrol_drain(nodes: list[str], reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", f"reason={reason}"]


def scontrol_resume(nodes: list[str]) -> list[str]:
    return ["scontrol", "update", f"nodename={','.join(nodes)}", "state=resume"]


# ---------------------------------------------------------------------------------- Slurm
def slurm_nodes() -> dict[str, tuple[str, str]]:
    """node -> (state, reason) from sinfo (one line per node and partition; reason may hold spaces)."""
    out = run(["sinfo", "-N", "-h", "-o", "%N|%T|%E"])
    nodes = {}
    for line in out.splitlines():
        name, state, reason = [*line.split("|", 2), "", ""][:3]
        nodes[name.strip()] = (state.strip().lower(), "" if reason.strip() == "none" else reason.strip())
    return nodes


def is_drained(state: str) -> bool:
    """sinfo %T: drained, draining, drained*, idle+drain, ..."""
    return "drain" in state or state.startswith("drng")


def plan_slurm(wanted: dict[str, str], current: dict[str, tuple[str, str]], ledger: Ledger) -> Plan:
    plan = Plan()
    for node, reason in sorted(wanted.items()):
        if node not in current:
            plan.skipped.append((node, "not a Slurm node"))
            continue
        state, slurm_reason = current[node]
        if is_drained(state):
            if not slurm_reason.startswith(OUR_REASON_PREFIX):
                plan.skipped.append((node, f"already drained by someone else: {slurm_reason}"))
            continue
        plan.drain.append((node, reason))
    for node in sorted(set(ledger.nodes) - set(wanted)):
        state, slurm_reason = current.get(node, ("", ""))
        if not is_drained(state):
            plan.skipped.append((node, "no longer drained in Slurm; forgotten"))
        elif not slurm_reason.startswith(OUR_REASON_PREFIX):
            plan.skipped.append((node, f"drained again by someone else ({slurm_reason}); left alone"))
        else:
            plan.resume.append(node)
    plan.commands = [scontrol_drain(nodes, reason) for reason, nodes in batches(plan.drain)]
    plan.commands += [scontrol_resume(nodes) for _, nodes in batches([(n, "") for n in plan.resume])]
    return plan


def sync_slurm(url: str, ledger_path: Path, dry_run: bool, timeout: float, token: str | None = None) -> Plan:
    wanted = fetch_drain_list(url, timeout, token)
    current = slurm_nodes()
    ledger = Ledger(ledger_path)
    plan = plan_slurm(wanted, current, ledger)
    if dry_run:
        return plan
    for reason, nodes in batches(plan.drain):
        run(scontrol_drain(nodes, reason))
        ledger.nodes.update(dict.fromkeys(nodes, reason))
        ledger.save()
    for _, nodes in batches([(n, "") for n in plan.resume]):
        run(scontrol_resume(nodes))
        for node in nodes:
            ledger.nodes.pop(node, None)
        ledger.save()
    for node, why in plan.skipped:
        if why.startswith(("no longer drained", "drained again")):
            ledger.nodes.pop(node, None)  # an operator owns it now
    ledger.save()
    return plan


# ---------------------------------------------------------------------------------- LSF
def plan_lsf(wanted: dict[str, str], ledger: Ledger) -> Plan:
    plan = Plan()
    for node, reason in sorted(wanted.items()):
        if node not in ledger.nodes:
            plan.drain.append((node, reason))
    plan.resume = sorted(set(ledger.nodes) - set(wanted))
    plan.commands = [["badmin", "hclose", "-C", reason, *nodes] for reason, nodes in batches(plan.drain)]
    plan.commands += [["badmin", "hopen", *nodes] for _, nodes in batches([(n, "") for n in plan.resume])]
    return plan


def sync_lsf(url: str, ledger_path: Path, dry_run: bool, timeout: float, token: str | None = None) -> Plan:
    wanted = fetch_drain_list(url, timeout, token)
    ledger = Ledger(ledger_path)
    plan = plan_lsf(wanted, ledger)
    if dry_run:
        return plan
    for reason, nodes in batches(plan.drain):
        run(["badmin", "hclose", "-C", reason, *nodes])
        ledger.nodes.update(dict.fromkeys(nodes, reason))
        ledger.save()
    for _, nodes in batches([(n, "") for n in plan.resume]):
        run(["badmin", "hopen", *nodes])
        for node in nodes:
            ledger.nodes.pop(node, None)
        ledger.save()
    return plan
