"""The twin's answers to FleetSight's active checks, in the tools' own output formats, for the faults a
node has now: a stand-in for `dcgmi diag -r N -j` (DCGM 4's JSON, NVIDIA/DCGM
testing/python3/dcgm_diag_schema.json), `ib_write_bw --report_gbits` (perftest's text) and FleetSight's
GPU probe lines (checks/parsers.py). The checks runner takes the command from its tools file, so on a
real host it runs the real tools and on the twin these:

    python -m twin.checks --faults FAULTS --node n0003 dcgmi diag -r 4 -j
    python -m twin.checks --faults FAULTS --node n0003 gpu-probe gemm
    python -m twin.checks --faults FAULTS --node n0004 ib_write_bw -d mlx5_2 ... -p 18517        (server)
    python -m twin.checks --faults FAULTS --node n0003 ib_write_bw -d mlx5_2 ... -p 18517 n0004  (client)

A tool that a ``check_tool_missing`` fault names for the node is not there: the stand-in prints what
``sh -c`` prints for a command it cannot find (dash: ``sh: 1: dcgmi: not found``) on stderr, nothing on
stdout, and exits 127, as the tool's wrapper (a shell, srun, a container's entry point) would.

FAULTS is the twin's ground-truth file (``*.truth.jsonl``: faults active now count) or a YAML mapping
``node: [{kind, gpu?, port?}]``. Which level runs which test is DCGM 4's own suite (NVIDIA/DCGM
``nvvs/src/NvidiaValidationSuite.cpp`` ``FillTestVectors``, v4.2.3 to v4.6.0; tests/fixtures/dcgmi/
PROVENANCE.md): memtest runs only at level 4 (``-r 4``), so silent HBM corruption is found there and
passes levels 1-3. IBM's Vela report calls that level "3": it ran an older DCGM's levels; the levels here
are DCGM 4's.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .truth import load_faults

GPUS = 8
COMPUTE_PORTS = 8
# (level from which the test runs, category, test name): DCGM 4's suites and plugin names (NVIDIA/DCGM
# v4.2.3 nvvs/src/NvidiaValidationSuite.cpp FillTestVectors; categories nvvs/include/PluginStrings.h
# *_PLUGIN_CATEGORY). Each level holds every test of the levels below it. Left out: eud and cpu_eud
# (level 3, only as root with NVIDIA's separate EUD package), nccl_tests (level 3 from 4.5.0) and rist
# (4.6.0, where its binary is configured).
TESTS = (
    (1, "Deployment", "software"),
    (2, "Hardware", "memory"),
    (2, "Integration", "pcie"),
    (3, "Hardware", "diagnostic"),
    (3, "Hardware", "nvbandwidth"),
    (3, "Stress", "memory_bandwidth"),
    (3, "Stress", "targeted_stress"),
    (3, "Stress", "targeted_power"),
    (4, "Stress", "memtest"),
    (4, "Hardware", "pulse_test"),
)
# `dcgmi diag -r`: a level or its name (dcgmi's aliases: quick/short, medium, long, xlong)
SUITES = {"1": 1, "quick": 1, "short": 1, "2": 2, "medium": 2, "3": 3, "long": 3, "4": 4, "xlong": 4}
# fault kind -> (test it fails, DCGM error id, error category, severity, message)
DIAG_FAILS = {
    "hbm_row_remap": (
        "software", 85, 10, 6, "GPU {gpu} has uncorrectable memory errors and row remappings are pending"
    ),
    "pcie_downgrade": (
        "pcie", 45, 13, 4, "GPU {gpu} is running at PCI link generation 1, below the minimum allowed (5)"
    ),
    "psu_failure": (
        "targeted_power", 63, 14, 4, "Max power of 150.0 did not reach the minimum 560.0 for GPU {gpu}"
    ),
    # DCGM_FR_MEMORY_MISMATCH (58), DCGM_FR_EC_HARDWARE_MEMORY (10), DCGM_ERROR_ISOLATE (2) and its
    # message, dcgmlib/dcgm_errors.h and src/dcgm_errors.c at v4.2.3
    "hbm_silent_corruption": (
        "memtest", 58, 10, 2, "A memory mismatch was detected on GPU {gpu}, but no error was reported by "
        "CUDA or NVML."
    ),
}  # fmt: skip
GEMM_TFLOPS, HBM_BYTES_PER_S, PORT_GBITS = 720.0, 2.95e12, 392.0


def active_faults(path: Path, node: str, now: float | None = None) -> list[dict[str, Any]]:
    """The faults active on the node now, each as ``{kind, **target}`` (what the stand-ins read): from
    the twin's truth file (read through its typed model, twin/truth.py), or from a YAML mapping."""
    now = time.time() if now is None else now
    if path.name.endswith(".jsonl"):
        return [
            {"kind": fault.kind, **fault.target}
            for fault in load_faults(path)
            if fault.node == node and fault.onset <= now < fault.end
        ]
    return list((yaml.safe_load(path.read_text()) or {}).get(node, []))


def dcgmi_diag(level: int, faults: list[dict[str, Any]], version: str = "4.2.3") -> dict[str, Any]:
    failing = {DIAG_FAILS[f["kind"]][0]: f for f in faults if f["kind"] in DIAG_FAILS}
    categories: dict[str, list[dict[str, Any]]] = {}
    for since, category, name in TESTS:
        if level >= since:
            categories.setdefault(category, []).append(_diag_test(name, failing.get(name)))
    return {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {"device_id": "2330", "entity_id": g, "serial_num": f"16520230{g:05d}"}
                    for g in range(GPUS)
                ],
            }
        ],
        "metadata": {"Driver Version Detected": "550.127.05", "version": version},
    }


def _diag_test(name: str, fault: dict[str, Any] | None) -> dict[str, Any]:
    results = []
    for gpu in range(GPUS):
        result: dict[str, Any] = {
            "entity_group": "GPU",
            "entity_group_id": 1,
            "entity_id": gpu,
            "status": "Pass",
        }
        if fault is not None and int(fault.get("gpu", 0)) == gpu:
            _, error_id, category, severity, text = DIAG_FAILS[fault["kind"]]
            result["status"] = "Fail"
            result["warnings"] = [
                {
                    "error_category": category,
                    "error_id": error_id,
                    "error_severity": severity,
                    "warning": text.format(gpu=gpu),
                }
            ]
        results.append(result)
    return {"name": name, "results": results, "test_summary": {"status": "Fail" if fault else "Pass"}}


def gpu_probe(test: str, faults: list[dict[str, Any]]) -> str:
    """FleetSight's probe lines (checks/parsers.py): a power-braked or gray-slow node computes slower."""
    slow = 1.0
    for fault in faults:
        if fault["kind"] == "psu_failure":
            slow = max(slow, 3.0)  # IBM Vela: ~400 W -> ~150 W, the job ~3x slower
        elif fault["kind"] == "gray_slow_node":
            slow = max(slow, float(fault.get("magnitude", 1.3)))
    lines = []
    for gpu in range(GPUS):
        if test == "gemm":
            lines.append(
                f"fleetsight-probe v1 test=gemm gpu={gpu} dtype=bf16 "
                f"tflops={GEMM_TFLOPS / slow:.1f} seconds=30.0"
            )
        else:
            lines.append(
                f"fleetsight-probe v1 test=hbm gpu={gpu} bytes_per_second={HBM_BYTES_PER_S:.4g} seconds=30.0"
            )
    return "\n".join([*lines, f"fleetsight-probe v1 done gpus={GPUS}"]) + "\n"


def _port_down(device: str, faults: list[dict[str, Any]]) -> bool:
    port = int(device.rsplit("_", 1)[-1]) if device[-1:].isdigit() else 0
    return any(f["kind"] == "ib_port_down" and int(f.get("port", 0)) == port for f in faults)


def ib_write_bw(device: str, faults: list[dict[str, Any]], partner_down: bool = False) -> str:
    """perftest's output with --report_gbits; a port down on either end of the link cannot connect its
    queue pair (perftest's own words), after the TCP handshake that runs over the management network."""
    if partner_down or _port_down(device, faults):
        return "Failed to modify QP 1234 to RTR\n Unable to Connect the HCA's through the link\n"
    rule = "-" * 87
    return (
        f"{rule}\n                    RDMA_Write BW Test\n Device         : {device}\n Link type       : IB\n"
        f"{rule}\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        f" 65536      5000             {PORT_GBITS + 0.6:.2f}             {PORT_GBITS:.2f}"
        "              0.748000\n"
        f"{rule}\n"
    )


# perftest options followed by a value; the one bare word left is the server's address (client side)
PERFTEST_VALUES = {"-d", "-i", "-D", "-p", "-s", "-n", "-m", "-q", "-x"}


def _perftest_args(args: list[str]) -> tuple[str, int, str | None]:
    device, tcp_port, host, i = "mlx5_0", 18515, None, 0
    while i < len(args):
        if args[i] in PERFTEST_VALUES and i + 1 < len(args):
            device = args[i + 1] if args[i] == "-d" else device
            tcp_port = int(args[i + 1]) if args[i] == "-p" else tcp_port
            i += 2
            continue
        if not args[i].startswith("-"):
            host = args[i]
        i += 1
    return device, tcp_port, host


def _serve(path: Path, mine: bytes, wait_s: float) -> bytes:
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(wait_s)
        try:
            connection, _ = server.accept()
            with connection:
                theirs = connection.recv(16)
                connection.sendall(mine)
        finally:
            path.unlink(missing_ok=True)
    return theirs


def _connect(path: Path, mine: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(mine)
        return client.recv(16)


def resolve(folder: Path, host: str) -> str:
    """The node a perftest client's address names. The twin's nodes share this host, so where the client
    is given an address (a Kubernetes node's InternalIP, not its name), ``twin-ib/hosts`` beside the
    faults file says whose it is, in /etc/hosts's format (``address name...``); a name stands for
    itself."""
    hosts = folder / "hosts"
    if hosts.exists():
        for line in hosts.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and host in fields:
                return fields[1]
    return host


def ib_pair(faults_file: Path, node: str, args: list[str], wait_s: float = 300.0) -> tuple[str, int]:
    """Both ends of ib_write_bw, as perftest runs them: the server (no address) waits for one client on
    its TCP port; the client connects to the partner's server, they trade their ports' state, and each
    prints what it measured. The twin's nodes share this host, so a node's TCP port is a Unix socket
    named after the node, in a folder beside the faults file (an address is resolved: :func:`resolve`)."""
    device, tcp_port, host = _perftest_args(args)
    faults = active_faults(faults_file, node)
    folder = faults_file.parent / "twin-ib"
    folder.mkdir(exist_ok=True)
    mine = b"down" if _port_down(device, faults) else b"up"
    if host is None:
        theirs = _serve(folder / f"{node}-{tcp_port}.sock", mine, wait_s)
    else:
        try:
            theirs = _connect(folder / f"{resolve(folder, host)}-{tcp_port}.sock", mine)
        except OSError:
            return f"Couldn't connect to {host}:{tcp_port}\n Unable to open file descriptor for socket\n", 1
    text = ib_write_bw(device, faults, partner_down=theirs != b"up")
    return text, 0 if "RDMA_Write" in text else 1


# The stand-in's tool words, the checks catalogue's tool names (checks/tools.yml) and the binary each runs
# on a node (what the shell reports missing when a check_tool_missing fault names the tool there).
TOOLS = {"dcgmi": "dcgmi", "gpu-probe": "gpu_probe", "ib_write_bw": "ib_write_bw"}
BINARIES = {"dcgmi": "dcgmi", "gpu_probe": "fleetsight-gpu-probe", "ib_write_bw": "ib_write_bw"}
NOT_FOUND_EXIT = 127  # POSIX shells' exit status for a command that is not found


def missing_tool(tool: str, faults: list[dict[str, Any]]) -> str | None:
    """The binary the node lacks for this stand-in tool word (a check_tool_missing fault names its
    catalogue tool), or None when it is installed."""
    name = TOOLS.get(tool)
    missing = {f.get("tool") for f in faults if f["kind"] == "check_tool_missing"}
    return BINARIES[name] if name is not None and name in missing else None


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[0] != "--faults" or argv[2] != "--node":
        print(
            "usage: python -m twin.checks --faults FILE --node NODE dcgmi|gpu-probe|ib_write_bw ARGS",
            file=sys.stderr,
        )
        return 2
    faults, tool, args = active_faults(Path(argv[1]), argv[3]), argv[4], argv[5:]
    binary = missing_tool(tool, faults)
    if binary is not None:  # the node has no such tool: the shell's words and status, nothing on stdout
        print(f"sh: 1: {binary}: not found", file=sys.stderr)
        return NOT_FOUND_EXIT
    if tool == "dcgmi" and "-r" in args:
        run = args[args.index("-r") + 1] if args.index("-r") + 1 < len(args) else ""
        level = SUITES.get(run.lower(), 0)
        if not level:
            print(f"twin.checks: dcgmi diag -r {run!r}: the stand-in runs suites 1-4 only", file=sys.stderr)
            return 2
        document = dcgmi_diag(level, faults)
        print(json.dumps(document, indent=4))
        return 226 if "Fail" in json.dumps(document) else 0  # dcgmi exits non-zero when a test fails
    if tool == "gpu-probe":
        print(gpu_probe(args[0] if args else "gemm", faults), end="")
        return 0
    if tool == "ib_write_bw":
        text, code = ib_pair(Path(argv[1]), argv[3], args)
        print(text, end="")
        return code
    print(f"twin.checks: unknown tool {tool!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
