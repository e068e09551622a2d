"""Sharding gives the same answers: every recording rule and every alert of rules/*.yml, evaluated on
one Prometheus over the whole fleet, and on two shards (metrics/sharding/generate.py's split of the
nodes and of the rules) with Thanos Ruler running the fleet-wide rules, read through Thanos Query.

The data is the same on both sides: the twin's history of metrics/scale/scenario.yaml (12 nodes, a
fault on most of them, every exporter) backfilled once, then split by the shard key the generated
configuration hashes (the target's `node`, else its address's host) with Prometheus's own hashmod
(the low 8 bytes of the key's MD5, mod K). Rule groups run every 5 s here (the same rules; only their
cadence changes) and Prometheus and Thanos look back 30 minutes, so the static history answers for
as long as the test runs. The two sides evaluate a few seconds apart over history that has ended, so
values are compared with a tolerance; label sets must be identical.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from metrics.sharding.generate import RULES_DIR, fleet_wide_names, rule_name, shard_relabelling, split_rules
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "metrics" / "scale" / "scenario.yaml"
THANOS = REPO / ".cache" / "bin" / "thanos"
SHARDS = 2
EXTERNAL = {"shard", "replica", "rule_replica"}  # labels the sides add; not part of a rule's answer
LOOKBACK = "30m"
REL_TOLERANCE = 0.05
MIN_ANSWERED = 30  # recording rules with series on the twin's history: equality is not only of empty answers
AGREEMENT_TIMEOUT_S = 150  # from the first rounds until both sides must agree
NODE = re.compile(r'[{,]node="([^"]*)"')
JOB = re.compile(r'[{,]job="([^"]*)"')
INSTANCE = re.compile(r'[{,]instance="([^"]*)"')


def hashmod(key: str, modulus: int) -> int:
    """Prometheus's relabel hashmod."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[8:], "big") % modulus


def shard_key(line: str) -> str:
    """The generated configuration's key: the target's `node` label, else its address's host. The
    fabric exporter's series name the nodes of their ports, but its target is one address."""
    job = JOB.search(line)
    node = NODE.search(line)
    if node and not (job and job.group(1) == "fleetsight-fabric"):
        return node.group(1)
    instance = INSTANCE.search(line)
    return instance.group(1).split(":")[0] if instance else ""


def split_openmetrics(source: Path, targets: list[Path]) -> None:
    handles = [open(t, "w") for t in targets]  # noqa: SIM115 (closed below)
    try:
        with open(source) as lines:
            for line in lines:
                if line.startswith("#"):
                    for handle in handles:
                        handle.write(line)
                else:
                    handles[hashmod(shard_key(line), SHARDS)].write(line)
    finally:
        for handle in handles:
            handle.close()


def create_blocks(source: Path, out: Path) -> None:
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=2h",
         str(source), str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip


def fast_rules(files: dict[str, Any], folder: Path) -> str:
    """The rule files with every group on a 5-second cadence; the glob that loads them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        groups = [{**group, "interval": "5s"} for group in content["groups"]]
        (folder / name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return str(folder / "*.yml")


def all_rules() -> dict[str, Any]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(RULES_DIR.glob("*.yml"))}


class Processes:
    def __init__(self, work: Path) -> None:
        self.work, self.procs = work, []

    def start(self, name: str, command: list[str]) -> None:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 (the process holds it)
        self.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in self.procs:
            process.terminate()
        for process in self.procs:
            process.wait(timeout=30)


def prometheus(procs: Processes, name: str, data: Path, rules: str, labels: dict[str, str]) -> str:
    port = free_port()
    config = procs.work / f"{name}.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "5s", "external_labels": labels},
                                      "rule_files": [rules]}))  # fmt: skip
    procs.start(name, ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                       f"--web.listen-address=127.0.0.1:{port}", f"--query.lookback-delta={LOOKBACK}",
                       "--storage.tsdb.retention.time=30d", "--storage.tsdb.min-block-duration=2h",
                       "--storage.tsdb.max-block-duration=2h"])  # fmt: skip
    return f"http://127.0.0.1:{port}"


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def sides(tmp_path_factory) -> Iterator[dict[str, str]]:
    assert THANOS.exists(), f"{THANOS} is missing: run `make setup` (it builds Thanos)"
    work = tmp_path_factory.mktemp("sharding")
    single = work / "single"
    result = subprocess.run(
        [sys.executable, "-m", "fleetsight.cli", "evaluate", "backfill", "--scenario", str(SCENARIO),
         "--out", str(single), "--agent-step", "10s", "--keep-openmetrics"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    history = sorted(work.glob("single-chunk-*.om"))
    shard_data = [work / f"shard-{i}" for i in range(SHARDS)]
    for source in history:
        parts = [work / f"{source.stem}-shard-{i}.om" for i in range(SHARDS)]
        split_openmetrics(source, parts)
        for part, data in zip(parts, shard_data, strict=True):
            create_blocks(part, data)
            part.unlink()
        source.unlink()
    local_files, fleet_files = split_rules()
    procs = Processes(work)
    try:
        urls = {"single": prometheus(procs, "single", single, fast_rules(all_rules(), work / "rules-all"),
                                     {"replica": "A"})}  # fmt: skip
        shard_rules = fast_rules(local_files, work / "rules-shard")
        grpc = []
        for i, data in enumerate(shard_data):
            url = prometheus(procs, f"shard-{i}", data, shard_rules, {"shard": str(i), "replica": "A"})
            wait_until(lambda u=url: ready(u), 120, what=f"shard {i}")
            grpc.append(free_port())
            procs.start(f"sidecar-{i}", [str(THANOS), "sidecar", f"--tsdb.path={data}",
                                         f"--prometheus.url={url}",
                                         f"--grpc-address=127.0.0.1:{grpc[-1]}",
                                         f"--http-address=127.0.0.1:{free_port()}"])  # fmt: skip
        query = f"http://127.0.0.1:{free_port()}"
        ruler_grpc = free_port()
        procs.start("query", [str(THANOS), "query", f"--http-address={query.removeprefix('http://')}",
                              f"--grpc-address=127.0.0.1:{free_port()}", "--query.replica-label=replica",
                              "--query.replica-label=rule_replica", f"--query.lookback-delta={LOOKBACK}",
                              *(f"--endpoint=127.0.0.1:{p}" for p in [*grpc, ruler_grpc])])  # fmt: skip
        ruler = f"http://127.0.0.1:{free_port()}"
        fleet_rules = fast_rules(fleet_files, work / "rules-fleet")
        procs.start("ruler", [str(THANOS), "rule", f"--data-dir={work / 'ruler'}", f"--query={query}",
                              f"--rule-file={fleet_rules}", "--eval-interval=5s", '--label=rule_replica="A"',
                              f"--grpc-address=127.0.0.1:{ruler_grpc}",
                              f"--http-address={ruler.removeprefix('http://')}"])  # fmt: skip
        for name, url in {**urls, "query": query, "ruler": ruler}.items():
            wait_until(lambda u=url: ready(u), 120, what=name)
        yield {"single": urls["single"], "sharded": query, "ruler": ruler}
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)


def instant(url: str, expr: str, at: float) -> dict[tuple, float]:
    response = httpx.get(
        f"{url}/api/v1/query", params={"query": expr, "time": at, "dedup": "true"}, timeout=60
    )
    response.raise_for_status()
    found: dict[tuple, float] = {}
    for item in response.json()["data"]["result"]:
        key = tuple(sorted((k, v) for k, v in item["metric"].items() if k not in EXTERNAL))
        # Two shards answering for the same series (a fleet-wide rule run per shard): never equal.
        found[key] = math.inf if key in found else float(item["value"][1])
    return found


def evaluated_rounds(url: str, since: float) -> int:
    """The fewest evaluations any group has had since ``since`` (by its last evaluation time)."""
    groups = httpx.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]
    stamps = [g.get("lastEvaluation", "") for g in groups]
    return min(1 if s and not s.startswith("0001") else 0 for s in stamps) if groups else 0


def close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=1e-9)


def snapshot(sides) -> dict[str, dict[str, dict[tuple, float]]]:
    """Every recording rule's answer and the firing alerts on both sides, now."""
    at = time.time()
    names = {rule_name(r) for c in all_rules().values() for g in c["groups"] for r in g["rules"]}
    records = sorted(n for n in names if ":" in n)
    out: dict[str, dict[str, dict[tuple, float]]] = {"single": {}, "sharded": {}}
    for side in out:
        url = sides["single" if side == "single" else "sharded"]
        for record in records:
            out[side][record] = instant(url, f'{{__name__="{record}"}}', at)
        alerts = instant(url, "ALERTS", at)
        for labels in alerts:
            name = dict(labels)["alertname"]
            key = tuple(kv for kv in labels if kv[0] != "alertstate")
            out[side].setdefault(f"ALERTS:{name}", {})[key] = 1.0
    return out


def disagreements(out: dict[str, dict[str, dict[tuple, float]]]) -> list[str]:
    single, sharded = out["single"], out["sharded"]
    found = []
    for name in sorted(set(single) | set(sharded)):
        one, other = single.get(name, {}), sharded.get(name, {})
        if set(one) != set(other) or not all(close(v, other[k]) for k, v in one.items()):
            found.append(f"{name}: single {len(one)} series, sharded {len(other)}")
    return found


@pytest.fixture(scope="module")
def answers(sides) -> dict[str, dict[str, dict[tuple, float]]]:
    """Each rule's answer on both sides, once both agree or the deadline passes (then the tests show
    what differs). Alerts read records of the previous round, and the ruler reads the shards' records
    through the query: a chain of rules needs a few 5 s rounds, more on a loaded machine, so the
    comparison is polled rather than taken after a fixed wait."""
    started = time.time()
    for side in ("single", "ruler"):
        wait_until(lambda s=side: evaluated_rounds(sides[s], started), 120, what=f"{side} rule groups")
    deadline = time.monotonic() + AGREEMENT_TIMEOUT_S
    while True:
        out = snapshot(sides)
        answered = sum(1 for r, v in out["single"].items() if v and not r.startswith("ALERTS:"))
        settled = answered >= MIN_ANSWERED and any(k.startswith("ALERTS:") for k in out["single"])
        if (settled and not disagreements(out)) or time.monotonic() > deadline:
            return out
        time.sleep(2)  # polling interval of a deadline loop, not a synchronisation


def test_every_recording_rule_gives_the_same_answer(answers):
    differ = []
    for record, single in answers["single"].items():
        if record.startswith("ALERTS:"):
            continue
        sharded = answers["sharded"].get(record, {})
        if set(single) != set(sharded) or not all(close(v, sharded[k]) for k, v in single.items()):
            differ.append(f"{record}: single {len(single)} series, sharded {len(sharded)}")
    assert differ == []
    answered = [r for r, v in answers["single"].items() if v and not r.startswith("ALERTS:")]
    records = sum(1 for r in answers["single"] if not r.startswith("ALERTS:"))
    print(f"{len(answered)} of {records}"
          " recording rules answer on the twin's history; all equal through 2 shards + ruler")  # fmt: skip
    # the history exercises most rules: equality is not only of empty answers
    assert len(answered) >= MIN_ANSWERED


def test_every_alert_gives_the_same_answer(answers):
    single = {k for k in answers["single"] if k.startswith("ALERTS:")}
    sharded = {k for k in answers["sharded"] if k.startswith("ALERTS:")}
    assert single == sharded
    for name in single:
        assert set(answers["single"][name]) == set(answers["sharded"][name]), name
    print(f"alerts on both sides: {sorted(n.removeprefix('ALERTS:') for n in single)}")
    # The faults of the scenario fire on both sides: one from each kind of placement at least.
    assert {"ALERTS:PSUFailed", "ALERTS:GPUFellOffBus", "ALERTS:InfiniBandPortDown"} <= single


def test_the_placement_names_rules_that_exist_and_shards_split_the_fleet():
    _, fleet = split_rules()
    fleet_names = {rule_name(r) for c in fleet.values() for g in c["groups"] for r in g["rules"]}
    assert fleet_names == fleet_wide_names()
    # The relabelling keeps a target on exactly one shard.
    keeps = [shard_relabelling(SHARDS, i)[-1]["regex"] for i in range(SHARDS)]
    assert keeps == [str(i) for i in range(SHARDS)]
    assert {hashmod(f"n{i:04d}", SHARDS) for i in range(1, 13)} == set(range(SHARDS))


def test_generated_shard_configurations_pass_promtool(tmp_path):
    """What an operator deploys: `python -m metrics.sharding.generate`, checked as Prometheus would
    load it (promtool also checks every rule file the configuration names)."""
    result = subprocess.run(
        [sys.executable, "-m", "metrics.sharding.generate", "--shards", "3", "--out", str(tmp_path),
         "--rules-path", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    configs = sorted(tmp_path.glob("prometheus-shard-*.yml"))
    assert [c.name for c in configs] == [f"prometheus-shard-{i}.yml" for i in range(3)]
    for index, config in enumerate(configs):
        check = subprocess.run(
            ["promtool", "check", "config", str(config)],
            capture_output=True, text=True, timeout=60,
            env={"PROMETHEUS_REPLICA": "A", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        loaded = yaml.safe_load(config.read_text())
        assert loaded["global"]["external_labels"]["shard"] == str(index)
        assert {"regex": "shard", "action": "labeldrop"} in loaded["alerting"]["alert_relabel_configs"]
