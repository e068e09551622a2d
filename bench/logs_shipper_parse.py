"""What the edge shipper's ruleset costs per record, with and without parsing the node's document: one
rsyslogd reads N edge documents (node wire format, logs_edge.edge_documents + node_json) from a file and
writes the id and day it found for each to another file, with
- `floor`: no ruleset work at all (imfile, the queue, omfile: what every variant pays);
- `full parse`: mmjsonparse, as the shipper did for every record before (and still does off the fast path);
- `fast path`: pipelines/rsyslog_conf.edge_fast_path, as the shipper does now.
rsyslogd's CPU seconds (from /proc) divided by N; variants alternate for --rounds, median printed. The ids and
days each variant found must agree, or the run fails. Kafka and OpenSearch are not involved: the drain
(`logs_throughput.py --path edge`) measures the whole shipper.

    .venv/bin/python bench/logs_shipper_parse.py [--docs 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from logs_edge import edge_documents, node_json

from pipelines.rsyslog_conf import edge_fast_path, edge_full_parse

FULL_PARSE = edge_full_parse()  # the shipper's own lines
VARIANTS = {
    "floor": ['  set $.id = "-";', "  set $.unix = 0;"],
    "full parse": FULL_PARSE,
    "fast path": [*edge_fast_path(), "  if not $.fast then {", *FULL_PARSE, "  }"],
}


def config(work: Path, source: Path, out: Path, body: list[str]) -> str:
    return "\n".join([
        f'global(workDirectory="{work}" maxMessageSize="64k")',
        'module(load="imfile")',
        'module(load="mmjsonparse")',
        'template(name="found" type="string" string="%$.day% %$.id%\\n")',
        'template(name="fleetsight_es_doc" type="string" string="%$!%")',
        'template(name="fleetsight_now" type="string" string="%timegenerated:::date-rfc3339%")',
        f'input(type="imfile" file="{source}" tag="edge" ruleset="ship" freshStartTail="off")',
        'ruleset(name="ship" queue.type="LinkedList" queue.size="200000" queue.workerThreads="2"',
        '        queue.dequeueBatchSize="5000") {',
        *body,
        '  set $.day = replace(substring(format_time($.unix, "date-rfc3339"), 0, 10), "-", ".");',
        f'  action(type="omfile" file="{out}" template="found")',
        "}",
    ])  # fmt: skip


def run(base: Path, source: Path, count: int, name: str) -> tuple[float, list[str]]:
    """rsyslogd's CPU seconds for the whole file, and what it wrote."""
    work = base / name.replace(" ", "-")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = work / "found.txt"
    conf = work / "rsyslog.conf"
    conf.write_text(config(work, source, out, VARIANTS[name]))
    process = subprocess.Popen(["rsyslogd", "-n", "-f", str(conf), "-i", str(work / "pid")])
    deadline = time.monotonic() + 600
    try:
        while (sum(1 for _ in out.open()) if out.exists() else 0) < count:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: rsyslogd stopped or stalled before {count:,} records")
            time.sleep(0.2)
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / 100
    finally:
        process.terminate()
        process.wait(timeout=30)
    return cpu, out.read_text().splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fleetsight-shipper-parse-"))
    try:
        source = base / "edge.jsonl"
        with source.open("w") as handle:
            for document in edge_documents(base / "docs", args.docs):
                handle.write(node_json(document) + "\n")
        costs: dict[str, list[float]] = {name: [] for name in VARIANTS}
        found: dict[str, list[str]] = {}
        for round_ in range(args.rounds):
            for name in VARIANTS:
                cpu, found[name] = run(base, source, args.docs, name)
                costs[name].append(1e6 * cpu / args.docs)
                print(f"round {round_ + 1}: {name}: {costs[name][-1]:.1f} us/record", flush=True)
        if sorted(found["fast path"]) != sorted(found["full parse"]):
            raise SystemExit("the fast path and the full parse found different ids or days")
        print(f"rsyslogd CPU per edge document ({args.docs:,} documents, median of {args.rounds} rounds); "
              "the same ids and days both ways:")  # fmt: skip
        for name, values in costs.items():
            rounds = ", ".join(f"{value:.1f}" for value in values)
            print(f"  {name}: {statistics.median(values):.1f} us/record ({rounds})")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
