"""The twin's formats and protocols, checked by the tools that consume them: prometheus_client's
parser, JSON-schema checks of Redfish, a real Prometheus scraping the twin through http_sd, and
promtool's backfill read back by Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import jsonschema
import yaml
from prometheus_client.parser import text_string_to_metric_families
from twin_helpers import FLEETSIGHT, scenario_arg, start_twin, stop_twin, wait_until

from fleetsight.settings import REPO_ROOT
from support import free_port
from twin.truth import load_truth

DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
ODATA = {"type": "object", "required": ["@odata.id", "@odata.type"]}
PSU_SCHEMA = {
    **ODATA,
    "required": ["@odata.id", "@odata.type", "Id", "Status", "PowerCapacityWatts", "Metrics"],
    "properties": {
        "Status": {
            "type": "object",
            "required": ["State", "Health"],
            "properties": {"Health": {"enum": ["OK", "Warning", "Critical"]}},
        },
        "PowerCapacityWatts": {"type": "number"},
    },
}
POWER_SCHEMA = {
    **ODATA,
    "required": ["@odata.id", "@odata.type", "PowerControl", "PowerSupplies"],
    "properties": {
        "PowerControl": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "object", "required": ["PowerConsumedWatts"]},
        },
        "PowerSupplies": {
            "type": "array",
            "items": {"type": "object", "required": ["MemberId", "Status", "PowerInputWatts"]},
        },
    },
}


def test_served_formats(twin_factory) -> None:
    run = twin_factory("psu_failure", "--duration", "3m")
    meta = run.meta()
    names = [n["name"] for n in meta["nodes"]]
    assert names == [f"n{i:04d}" for i in range(1, 6)]
    # dcgm-exporter text, as Prometheus's client library parses it.
    for node in meta["nodes"]:
        response = run.get(f"/dcgm/{node['name']}/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        assert {
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "DCGM_FI_DEV_XID_ERRORS",
        } <= set(families)
        samples = families["DCGM_FI_DEV_POWER_USAGE"].samples
        assert len(samples) == 8
        uuids = {g["gpu"]: g["uuid"] for g in node["gpus"]}
        for sample in samples:
            assert set(sample.labels) >= DCGM_LABELS
            assert sample.labels["Hostname"] == node["name"]
            assert sample.labels["UUID"] == uuids[int(sample.labels["gpu"])]
            assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", sample.labels["pci_bus_id"])
            assert sample.labels.get("hpc_job") in ("2001", None)
        assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    # Redfish: walk from the service root by following @odata.id links appended to the BMC base URL.
    base = "/bmc/n0002"
    root = run.get(base + "/redfish/v1/").json()
    jsonschema.validate(root, ODATA)
    chassis_list = run.get(base + root["Chassis"]["@odata.id"]).json()
    chassis = run.get(base + chassis_list["Members"][0]["@odata.id"]).json()
    jsonschema.validate(run.get(base + chassis["Power"]["@odata.id"]).json(), POWER_SCHEMA)
    subsystem = run.get(base + chassis["PowerSubsystem"]["@odata.id"]).json()
    supplies = run.get(base + subsystem["PowerSupplies"]["@odata.id"]).json()
    assert supplies["Members@odata.count"] == len(supplies["Members"]) == 6
    for member in supplies["Members"]:
        psu = run.get(base + member["@odata.id"]).json()
        jsonschema.validate(psu, PSU_SCHEMA)
        metrics = run.get(base + psu["Metrics"]["@odata.id"]).json()
        assert metrics["InputPowerWatts"]["Reading"] > 0
    assert run.get(base + "/redfish/v1/Chassis/nope").status_code == 404
    # UFM, Slurm, discovery.
    ports = run.get("/ufm/ufmRest/resources/ports").json()
    assert len(ports) == 5 * 10 * 2  # each HCA port and the leaf port it is cabled to
    hca = next(p for p in ports if p["node_description"] == "n0001 mlx5_0")
    assert {
        "physical_state",
        "logical_state",
        "active_speed",
        "active_width",
        "peer",
        "peer_node_name",
    } <= set(hca)
    peer = next(p for p in ports if p["name"] == hca["peer"])
    assert peer["peer"] == hca["name"]
    systems = run.get("/ufm/ufmRest/resources/systems").json()
    assert {s["system_name"] for s in systems} >= set(names)
    csv = run.get("/ufm/csv/metrics").text.splitlines()
    assert csv[0].startswith("timestamp,") and len(csv) == 1 + 50
    jobs = run.get("/slurm/v0.0.40/jobs").json()
    assert jobs["jobs"][0]["job_id"] == 2001 and jobs["jobs"][0]["nodes"] == "n[0001-0004]"
    assert jobs["jobs"][0]["start_time"]["set"] is True
    targets = run.get("/targets/dcgm.json").json()
    assert [t["labels"]["node"] for t in targets] == names
    assert all(t["labels"]["__metrics_path__"] == f"/dcgm/{t['labels']['node']}/metrics" for t in targets)
    # The root page links every endpoint, and every link answers.
    page = run.get("/").text
    links = re.findall(r'href="(http://[^"]+)"', page)
    assert len(links) >= 2 * len(names) + 6
    for link in links:
        assert httpx.get(link, timeout=10).status_code == 200, link
    assert run.get("/nope").status_code == 404
    # Nothing served names the scenario or says its description: the page is titled with the cluster.
    scenario = yaml.safe_load(Path(scenario_arg("psu_failure")).read_text())
    served = [run.get(path).text for path in ("/?format=json", "/slurm/v0.0.40/jobs", "/slurm/v0.0.40/nodes")]
    assert scenario["cluster"]["name"] in page
    for text in (page, *served):
        assert scenario["name"] not in text and scenario["description"] not in text


def read_sysfs_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sysfs_strings_counters_and_determinism(twin_factory) -> None:
    first = twin_factory("ib_link_flap", "--duration", "10m", serve=False, name="a")
    again = twin_factory("ib_link_flap", "--duration", "10m", serve=False, name="b")
    later = twin_factory("ib_link_flap", "--duration", "12m", serve=False, name="c")
    assert first.truth() == again.truth(), "same scenario and seed, same truth"
    tree_a = read_sysfs_tree(first.node("n0001") / "sys")
    assert tree_a == read_sysfs_tree(again.node("n0001") / "sys"), "same seed, same files"
    tree_c = read_sysfs_tree(later.node("n0001") / "sys")
    port = "class/infiniband/mlx5_0/ports/1"
    assert tree_a[f"{port}/state"] == "4: ACTIVE\n"
    assert tree_a[f"{port}/phys_state"] == "5: LinkUp\n"
    assert tree_a[f"{port}/rate"] == "400 Gb/sec (4X NDR)\n"
    assert tree_a[f"{port}/link_layer"] == "InfiniBand\n"
    assert tree_a["bus/pci/devices/0000:18:00.0/class"] == "0x030200\n"
    assert tree_a["bus/pci/devices/0000:18:00.0/device"] == "0x2330\n"
    link = first.node("n0001") / "sys/class/infiniband/mlx5_0/device"
    assert link.resolve() == (first.node("n0001") / "sys/bus/pci/devices/0000:1a:00.0").resolve()
    for path, value in tree_a.items():
        if "/counters/" in path or "/hw_counters/" in path:
            assert re.fullmatch(r"\d+\n", value), path
            assert int(tree_c[path]) >= int(value), f"{path} must not go backwards"
    words = int(tree_c[f"{port}/counters/port_xmit_data"]) - int(tree_a[f"{port}/counters/port_xmit_data"])
    # 4-byte words: 2 minutes of an llm-20b all-reduce rail at ~2.5 GB/s is ~7.5e10 words.
    assert 1e10 < words < 2e11
    stats = next((first.node("n0001") / "proc/fs/lustre/llite").glob("lustre-*/stats")).read_text()
    assert re.search(r"^snapshot_time\s+\d+\.\d{9} secs\.nsecs$", stats, re.M)
    assert re.search(r"^read_bytes\s+\d+ samples \[bytes\] \d+ \d+ \d+ \d+$", stats, re.M)


def test_bad_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncluster: {nodes: 2}\nfaults:\n  - {kind: meteor, target: {node: n0001}}\n")
    result = subprocess.run(
        [*FLEETSIGHT, "twin", "run", "--scenario", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 1
    assert "faults[0].kind" in result.stderr and "Traceback" not in result.stderr


def test_paced_run_advances_and_prometheus_scrapes_it(tmp_path: Path) -> None:
    """A paced twin (60x) scraped by a real Prometheus through the component's http_sd config."""
    log = tmp_path / "twin.log"
    twin = subprocess.Popen(
        [
            *FLEETSIGHT,
            "twin",
            "run",
            "--scenario",
            scenario_arg("psu_failure"),
            "--out",
            str(tmp_path / "out"),
            "--speed",
            "60",
            "--serve",
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    prometheus = None
    try:
        url = wait_until(
            lambda: (m := re.search(r"event=serving url=(\S+)", log.read_text())) and m.group(1),
            timeout=60,
            what="twin to serve",
        )

        def energy() -> float:
            text = httpx.get(f"{url}/dcgm/n0001/metrics", timeout=5).text
            return sum(
                s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"
            )

        first = energy()
        wait_until(lambda: energy() > first, timeout=30, what="the energy counter to advance")
        port = int(url.rsplit(":", 1)[1])
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "dcgm",
                    "scrape_interval": "1s",
                    "http_sd_configs": [{"url": f"{url}/targets/dcgm.json", "refresh_interval": "5s"}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        prometheus = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def series() -> list:
            try:
                body = httpx.get(
                    f"http://127.0.0.1:{prom_port}/api/v1/query",
                    params={"query": 'DCGM_FI_DEV_POWER_USAGE{job="dcgm"}'},
                    timeout=5,
                ).json()
            except (httpx.HTTPError, ValueError):  # not up yet, or "Service Unavailable" while starting
                return []
            result = body.get("data", {}).get("result", [])
            return result if len(result) == 5 * 8 else []

        result = wait_until(series, timeout=90, interval=0.5, what="Prometheus to scrape every node")
        assert {r["metric"]["node"] for r in result} == {f"n{i:04d}" for i in range(1, 6)}
        assert all(
            r["metric"]["cluster"] == "fmt" and r["metric"]["instance"].endswith(f":{port}") for r in result
        )
    finally:
        for process in (prometheus, twin):
            if process is not None:
                process.terminate()
                process.wait(timeout=20)


def test_backfill_blocks_are_queryable(tmp_path: Path) -> None:
    blocks = tmp_path / "tsdb"
    result = subprocess.run(
        [
            *FLEETSIGHT,
            "evaluate",
            "backfill",
            "--scenario",
            scenario_arg("psu_failure"),
            "--out",
            str(blocks),
            "--duration",
            "2h",
            "--end",
            "2026-11-21T12:00:00Z",
            "--no-agents",  # dcgm series only: what this test reads
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    listing = subprocess.run(
        ["promtool", "tsdb", "list", str(blocks)], capture_output=True, text=True, check=True
    )
    assert re.search(r"^01\w+", listing.stdout, re.M), listing.stdout
    (blocks / "wal").mkdir(exist_ok=True)  # promtool 2.42 opens the WAL even to dump blocks
    dump = subprocess.run(
        ["promtool", "tsdb", "dump", str(blocks)], capture_output=True, text=True, check=True
    )
    wanted = ('__name__="DCGM_FI_DEV_CLOCKS_EVENT_REASONS"', 'gpu="0"', 'node="n0002"')
    values = [float(line.split()[-2]) for line in dump.stdout.splitlines() if all(w in line for w in wanted)]
    assert len(values) == 2 * 3600 // 5
    # The power brake (8m..16m after the start) shows as bit 128 in the history, and only then.
    braked = [v for v in values if int(v) // 128 % 2 == 1]
    assert 80 <= len(braked) <= 100
    # dcgm-exporter's hpc_job label while the job runs on the GPU (n0005 is idle: no label).
    assert 'hpc_job="2001"' in dump.stdout
    assert not [line for line in dump.stdout.splitlines() if 'node="n0005"' in line and "hpc_job" in line]
    truth = load_truth(tmp_path / "tsdb.truth.jsonl")  # beside the blocks, never in them
    assert [line["kind"] for line in truth] == ["psu_failure"] and truth[0]["job"] == "2001"
    assert not list(blocks.rglob("*truth*"))


def test_paced_run_rewrites_only_changed_files(tmp_path: Path) -> None:
    """On a disk every rewritten file costs I/O: a paced run must leave unchanged files alone (same
    inode, same mtime) and grow counters in place, or 256 nodes cannot keep real time."""
    out, log = tmp_path / "out", tmp_path / "twin.log"
    command = [*FLEETSIGHT, "twin", "run", "--scenario", scenario_arg("gray_slow_node"), "--out", str(out)]
    twin = subprocess.Popen(
        [*command, "--speed", "10", "--duration", "2m"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    try:
        wait_until(lambda: "event=run_start" in log.read_text(), timeout=60, what="the first tick")
        node = out / "nodes" / "n0001"
        port = node / "sys/class/infiniband/mlx5_0/ports/1"
        unchanged = [
            node / "sys/bus/pci/devices/0000:18:00.0/vendor",
            node / "sys/bus/pci/devices/0000:18:00.0/max_link_speed",
            node / "sys/bus/pci/devices/0000:18:00.0/current_link_speed",
            port / "link_layer",
            port / "state",
            port / "rate",
            port / "counters/link_downed",
        ]
        before = {path: path.stat() for path in unchanged}
        counter = port / "counters/port_xmit_data"
        counter_inode = counter.stat().st_ino
        seen = [counter.read_text()]

        def counted_twice_more() -> bool:
            value = counter.read_text()
            if value != seen[-1]:
                seen.append(value)
            return len(seen) >= 3

        wait_until(counted_twice_more, timeout=60, interval=0.05, what="two more ticks of port_xmit_data")
        assert int(seen[2]) > int(seen[1]) > int(seen[0]), seen
        assert counter.stat().st_ino == counter_inode, "a growing counter is written in place"
        for path, stat in before.items():
            now = path.stat()
            assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns), f"{path} was rewritten"
        assert twin.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if twin.poll() is None:
            twin.kill()
            twin.wait()
    # Overall: the first tick writes every file, later ticks only the ~10% that changed.
    files = sum(1 for path in out.rglob("*") if path.is_file())
    written = int(re.search(r"event=run_end .*files_written=(\d+)", log.read_text()).group(1))
    ticks = int(re.search(r"event=run_end ticks=(\d+)", log.read_text()).group(1))
    assert ticks >= 20
    assert written < files + ticks * files / 4, f"{written} writes for {files} files in {ticks} ticks"


def test_the_cluster_name_given_replaces_the_scenarios_everywhere_it_shows(tmp_path: Path) -> None:
    # the local stack passes FLEETSIGHT_CLUSTER: meta.json and every served target must carry it
    small = tmp_path / "small.yaml"
    small.write_text("name: small\nduration: 1m\ncluster: {name: scenario-name, nodes: 2}\n")
    run = start_twin(str(small), tmp_path / "o", "--cluster-name", "vela-2")
    try:
        assert json.loads((tmp_path / "o" / "meta.json").read_text())["cluster"] == "vela-2"
        targets = run.get("/targets/dcgm.json").json()
        assert targets and {group["labels"]["cluster"] for group in targets} == {"vela-2"}
    finally:
        stop_twin(run)
    bad = subprocess.run(
        [
            *FLEETSIGHT,
            "twin",
            "run",
            "--scenario",
            str(small),
            "--out",
            str(tmp_path / "b"),
            "--cluster-name",
            "a b",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert bad.returncode == 2 and "--cluster-name" in bad.stderr and "Traceback" not in bad.stderr
