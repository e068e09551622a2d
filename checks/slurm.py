"""Intrusive checks as Slurm's own unit of work, one pass at a time (`fleetsight checks slurm-cycle`).

- A check on an idle node is a batch job: ``sbatch --nodelist=N --exclusive --job-name=fleetsight-check:C``
  that runs `fleetsight checks run` there and posts the result to the checks service. Exclusive: Slurm
  itself keeps it off a node with a job, and keeps jobs off the node while it runs.
- A check that validates a node FleetSight drained: Slurm never starts a job on a DRAIN node, not even
  in a reservation (tried on 22.05). So the pass holds the node in a maintenance reservation of its own
  (``fleetsight-validate-N``, Flags=MAINT,IGNORE_JOBS: no user job can land there), resumes the node,
  queues the check job in it, and drains it again with FleetSight's own reason as soon as the job runs. The
  node is never both undrained and free for users; the health service's drain stays as it was.
- A pair check (ib_write_bw) is one job on both nodes: ``sbatch -N2 --nodelist=A,B`` whose one step
  (``srun -N2 --ntasks-per-node=1``) runs `fleetsight checks pair` on each, the server side on B and the
  client on A, which posts the result for both nodes. Both leaves are held while it runs.
- The node's comment shows the latest results: ``fleetsight-checks: dcgm_diag_r3=PASS row_remap=ERR``.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import runner
from .catalog import Check
from .plan import Decision, Unit, plan, with_partners
from .runner import TOKEN_FILE_ENV

log = logging.getLogger("fleetsight.checks.slurm")
JOB_PREFIX = "fleetsight-check:"
RESERVATION_PREFIX = "fleetsight-validate-"
OUR_DRAIN = "fleetsight:"
NODES_COMMENT = "fleetsight-nodes="  # the job's own record of its nodes: squeue compresses %N (n[1-2])


@dataclass
class SlurmNode:
    name: str
    state: str  # sinfo %T: idle, allocated, mixed, drained, draining, down, ...
    reason: str

    @property
    def ours_drained(self) -> bool:
        return self.state == "drained" and self.reason.startswith(OUR_DRAIN)


@dataclass
class SlurmChecks:
    catalog: dict[str, Check]
    checks_url: str
    job_command: list[str]  # how a batch job starts FleetSight on the node (python -m fleetsight.cli)
    tools_file: Path
    output_dir: Path
    env: Mapping[str, str] | None = None
    leaf_map: Mapping[str, frozenset[str]] | None = None
    budget: int = 2
    # How long a validation job may stay PENDING once its node is resumed. Above Slurm's periodic
    # scheduling pass (sched_interval, 60 s by default): a busy slurmctld may start it only then.
    start_timeout_s: float = 90.0
    # The jobs' token for POST /v1/results (scope `results`): a file readable on the nodes (a shared or
    # root-only path the job reads; only its path goes through Slurm). None: the job gets whatever
    # FLEETSIGHT_CHECKS_TOKEN/_TOKEN_FILE the cycle has (sbatch --export=ALL; a bare token then sits in
    # the job's environment, which slurmctld keeps: the file is the better choice).
    token_file: str | None = None
    caps: Mapping[str, int] = field(default_factory=dict)  # a scan's own budget (checks/scan.py)

    # ------------------------------------------------------------------ reading Slurm
    def run(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=60, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def nodes(self) -> dict[str, SlurmNode]:
        lines = self.run("sinfo", "-N", "-h", "-o", "%N|%T|%E").splitlines()
        nodes = {}
        for line in lines:
            name, state, reason = line.split("|", 2)
            nodes[name] = SlurmNode(name, state.rstrip("*~#$@%!^-"), "" if reason == "none" else reason)
        return nodes

    def running(self) -> list[tuple[str, Unit, str]]:
        """(job id, unit, state) of FleetSight's check jobs still queued or running."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T|%k")
        jobs = []
        for line in out.splitlines():
            job, name, state, comment = line.split("|", 3)
            if name.startswith(JOB_PREFIX) and comment.startswith(NODES_COMMENT):
                nodes = tuple(comment[len(NODES_COMMENT) :].split(","))
                jobs.append((job, Unit(name[len(JOB_PREFIX) :], nodes), state))
        return jobs

    def reservations(self) -> list[str]:
        out = self.run("scontrol", "-o", "show", "reservation", check=False)
        return [
            word.split("=", 1)[1]
            for word in out.split()
            if word.startswith("ReservationName=") and RESERVATION_PREFIX in word
        ]

    # ------------------------------------------------------------------ one pass
    def cycle(self, wanted: list[Unit]) -> Decision:
        """Tidy up finished validations, then start what the plan allows now."""
        nodes = self.nodes()
        running = self.running()
        self._end_reservations({n for _, u, _ in running for n in u.nodes})
        drained = {n for n, v in nodes.items() if v.ours_drained}  # FleetSight's: validation runs there
        healthy = {n for n, v in nodes.items() if v.state == "idle"}
        pairs = {c.name for c in self.catalog.values() if c.nodes == 2}
        wanted = with_partners(wanted, pairs, healthy, self.leaf_map or {})
        kept_out = [u for u in wanted if not u.validation and drained & set(u.nodes)]
        wanted = [u for u in wanted if u not in kept_out]
        sizes = {c.name: c.nodes for c in self.catalog.values()}
        busy = [u for _, u, _ in running]
        decision = plan(wanted, healthy | drained, busy, self.leaf_map or {}, self.budget, sizes, self.caps)
        decision.waiting.update({u: "drained by FleetSight: validation checks only" for u in kept_out})
        for unit in decision.start:
            self.submit(unit, nodes)
        return decision

    def _end_reservations(self, testing: set[str]) -> None:
        for name in self.reservations():
            if name[len(RESERVATION_PREFIX) :] not in testing:
                self.run("scontrol", "delete", f"ReservationName={name}", check=False)

    def submit(self, unit: Unit, nodes: Mapping[str, SlurmNode]) -> str:
        check = self.catalog[unit.check]
        drained = {n: nodes[n].reason for n in unit.nodes if n in nodes and nodes[n].ours_drained}
        if not drained:
            return self._submit_job(check, unit, None)
        reservation = f"{RESERVATION_PREFIX}{unit.nodes[0]}"
        self.run(  # the pair's healthy partner is held too: no user job lands between the two
            "scontrol", "create", "reservation", f"ReservationName={reservation}",
            f"Nodes={','.join(unit.nodes)}", "StartTime=now", "Duration=UNLIMITED", "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip
        # Resume before submitting: a job queued on a drained node waits for Slurm's next periodic pass
        # (sched_interval, 60 s by default) when the resume comes after the pass its submission triggered.
        for node in drained:
            self.run("scontrol", "update", f"nodename={node}", "state=resume")
        try:
            job = self._submit_job(check, unit, reservation)
            self._wait_started(job, list(drained))
        finally:  # the drain goes back whatever happened: the job keeps running, a drain only stops new work
            for node, reason in drained.items():
                self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
        return job

    def _submit_job(self, check: Check, unit: Unit, reservation: str | None) -> str:
        job = self.run(*self._sbatch(check, unit, reservation)).strip().split(";")[0]
        log.info(
            "event=check_submitted job=%s check=%s nodes=%s validation=%s",
            job, check.name, ",".join(unit.nodes), reservation is not None,
        )  # fmt: skip
        return job

    def _inner(self, check: Check, unit: Unit) -> list[str]:
        """The job's command line: `checks run` on one node, or both sides of a pair in one step."""
        common = ["--tools", str(self.tools_file), "--report", self.checks_url]
        if check.nodes == 1:
            one = ["checks", "run", "--node", unit.nodes[0], "--check", check.name]
            return [*self.job_command, *one, *common]
        client, server = unit.nodes
        step = ["srun", "-N2", "-n2", "--ntasks-per-node=1", f"--nodelist={client},{server}"]
        pair = ["checks", "pair", "--check", check.name, "--client", client, "--server", server]
        return [*step, *self.job_command, *pair, *common]  # each task's side: its SLURMD_NODENAME

    def _sbatch(self, check: Check, unit: Unit, reservation: str | None) -> list[str]:
        minutes = max(1, int(2 * check.seconds // 60) + 1)
        where = ",".join(unit.nodes)
        command = ["sbatch", "--parsable", f"--job-name={JOB_PREFIX}{check.name}", f"--nodelist={where}"]
        command += [f"-N{len(unit.nodes)}", f"--comment={NODES_COMMENT}{where}"]
        command += ["--exclusive", f"--time={minutes}", f"--output={self.output_dir}/%j.out"]
        if reservation:
            command.append(f"--reservation={reservation}")
        # ALL: the cycle's environment (FLEETSIGHT_CHECKS_TOKEN[_FILE] among it) even where a site sets
        # SBATCH_EXPORT=NONE; a configured token file is named explicitly. Slurm splits --export on
        # commas, so a path with one cannot be passed this way.
        export = "ALL"
        if self.token_file:
            if "," in self.token_file:
                raise ValueError(f"token file {self.token_file!r}: Slurm's --export cannot pass a comma")
            export += f",{TOKEN_FILE_ENV}={self.token_file}"
        command.append(f"--export={export}")
        return [*command, f"--wrap={shlex.join(self._inner(check, unit))}"]

    def _wait_started(self, job: str, nodes: list[str]) -> None:
        """Wait for the validation job to leave PENDING; cancel it past start_timeout_s (the next pass
        submits it again) and say why Slurm held it."""
        started = time.monotonic()
        why = ""
        while time.monotonic() - started < self.start_timeout_s:
            answer = self.run("squeue", "-h", "-j", job, "-o", "%T|%r", check=False).strip()
            state, _, why = answer.partition("|")
            if state != "PENDING":
                waited = time.monotonic() - started
                log.info("event=check_started job=%s state=%s waited_s=%.1f", job, state or "gone", waited)
                return
            time.sleep(0.5)  # polling the scheduler, bounded by the deadline
        self.run("scancel", job, check=False)
        log.warning(
            "event=check_not_started job=%s nodes=%s waited_s=%.0f pending_reason=%s",
            job, ",".join(nodes), self.start_timeout_s, why or "unknown",
        )  # fmt: skip

    # ------------------------------------------------------------------ results where people look
    def publish_comments(self, results: list[dict[str, Any]]) -> dict[str, str]:
        by_node: dict[str, list[str]] = {}
        for item in sorted(results, key=lambda r: (r["node"], r["check"])):
            by_node.setdefault(item["node"], []).append(f"{item['check']}={runner.status_of(item)}")
        comments = {node: "fleetsight-checks: " + " ".join(words) for node, words in by_node.items()}
        for node, comment in comments.items():
            self.run("scontrol", "update", f"nodename={node}", f"comment={comment}", check=False)
        return comments


def validation_requests(
    health_url: str, catalog: Mapping[str, Check], retry_after: float = 3600.0, now: float | None = None
) -> list[Unit]:
    """The intrusive checks the health service's validation gate waits for, and reruns of failed ones
    once ``retry_after`` seconds have passed (time for a repair) since they failed."""
    now = time.time() if now is None else now
    response = httpx.get(f"{health_url.rstrip('/')}/v1/validation", timeout=10)
    response.raise_for_status()
    units = []
    for item in response.json().get("nodes", []):
        names = list(item.get("missing", [])) if item.get("phase") in ("validating", "failed") else []
        if item.get("phase") == "failed":
            names += [f["check"] for f in item.get("failed", []) if now - float(f["finished"]) >= retry_after]
        units += [
            Unit(name, (item["node"],), validation=True)
            for name in names
            if name in catalog and catalog[name].intrusive
        ]
    return units
