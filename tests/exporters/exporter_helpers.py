"""Helpers for the exporter tests and benchmarks: a node's sysfs/procfs tree in the kernel's real
formats, a small real HTTP server speaking JSON (Redfish, UFM), exposition parsing.

Not a conftest: tests import it by name (``from exporter_helpers import ...``), the benchmarks by path.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporters.node import NodeAgent, NodeOptions

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# H100 HGX-like bus numbers: GPUs, and the compute NIC next to each.
GPU_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
STORAGE_NIC_BUSES = [0x4F, 0xC1]
NVME_BUSES = [0x62, 0x63]
IB_COUNTERS = [
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
]
IB_HW_COUNTERS = [
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_read_requests",
    "rx_write_requests",
]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def bdf(bus: int) -> str:
    return f"0000:{bus:02x}:00.0"


@dataclass
class NodeSpec:
    gpus: int = 8
    ib_devices: int = 10
    oscs: int = 100
    topology: bool = True  # devices/<bdf> as links into a PCI hierarchy, as on a real host
    downgraded_gpu: int | None = None  # this GPU's link runs at Gen3 x8
    down_ib_device: int | None = None  # this HCA's port is down
    no_pma_device: int | None = None  # this HCA answers "N/A (no PMA)" for its counters
    counter_base: int = 1_000_000
    kern_lines: list[str] = field(default_factory=list)


def pci_device(sys_root: Path, parent: Path, bus: int, attrs: dict[str, str], topology: bool) -> Path:
    """A PCI device folder with its attributes; devices/<bdf> links to it (or is it, when flat)."""
    name = bdf(bus)
    real = parent / name if topology else sys_root / "bus" / "pci" / "devices" / name
    real.mkdir(parents=True, exist_ok=True)
    for attr, value in attrs.items():
        (real / attr).write_text(value + "\n")
    link = sys_root / "bus" / "pci" / "devices" / name
    if topology:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(real, link.parent))
    return real


def link_attrs(
    vendor: str, device: str, pci_class: str, speed: str, width: int, max_speed: str, max_width: int
):
    return {
        "vendor": vendor,
        "device": device,
        "class": pci_class,
        "current_link_speed": speed,
        "max_link_speed": max_speed,
        "current_link_width": str(width),
        "max_link_width": str(max_width),
    }


def build_node(root: Path, spec: NodeSpec | None = None) -> dict[str, Path]:
    """A node's ``sys``, ``proc`` and ``var/log/kern.log`` under root, in the kernel's real formats."""
    spec = spec or NodeSpec()
    sys_root, proc_root = root / "sys", root / "proc"
    host_bridge = sys_root / "devices" / "pci0000:00"
    # A host bridge without a PCIe link: must be ignored, not reported.
    pci_device(
        sys_root,
        host_bridge,
        0x00,
        {"vendor": "0x8086", "device": "0x09a2", "class": "0x060000"},
        spec.topology,
    )
    nic_bdfs = {}
    for i in range(spec.gpus):
        bus = GPU_BUSES[i]
        switch_up = pci_device(
            sys_root,
            host_bridge,
            bus - 2,
            link_attrs("0x1000", "0xc030", "0x060400", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16),
            spec.topology,
        )
        switch_down = pci_device(
            sys_root,
            switch_up,
            bus - 1,
            link_attrs("0x1000", "0xc030", "0x060400", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16),
            spec.topology,
        )
        slow = i == spec.downgraded_gpu
        pci_device(
            sys_root,
            switch_down,
            bus,
            link_attrs(
                "0x10de",
                "0x2330",
                "0x030200",
                "8.0 GT/s PCIe" if slow else "32.0 GT/s PCIe",
                8 if slow else 16,
                "32.0 GT/s PCIe",
                16,
            ),
            spec.topology,
        )
        if i < spec.ib_devices:
            nic = pci_device(
                sys_root,
                switch_down,
                bus + 1,
                link_attrs("0x15b3", "0x1021", "0x020700", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16),
                spec.topology,
            )
            nic_bdfs[i] = nic
    for j, bus in enumerate(STORAGE_NIC_BUSES[: max(0, spec.ib_devices - spec.gpus)]):
        nic_bdfs[spec.gpus + j] = pci_device(
            sys_root,
            host_bridge,
            bus,
            link_attrs("0x15b3", "0x1021", "0x020700", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16),
            spec.topology,
        )
    for bus in NVME_BUSES:
        pci_device(
            sys_root,
            host_bridge,
            bus,
            link_attrs("0x144d", "0xa824", "0x010802", "16.0 GT/s PCIe", 4, "16.0 GT/s PCIe", 4),
            spec.topology,
        )
    for index, nic in sorted(nic_bdfs.items()):
        build_ib_device(sys_root, f"mlx5_{index}", nic, spec, index)
    build_lustre(proc_root, spec.oscs)
    write(proc_root / "sys" / "kernel" / "random" / "boot_id", "4f1d7c1e-2b3a-4c5d-8e9f-0a1b2c3d4e5f\n")
    write(proc_root / "stat", "cpu  1 2 3 4\nbtime 1795250000\n")
    kern_log = root / "var" / "log" / "kern.log"
    write(kern_log, "".join(line + "\n" for line in spec.kern_lines))
    return {"sys": sys_root, "proc": proc_root, "kern_log": kern_log}


def build_ib_device(sys_root: Path, name: str, pci_dir: Path, spec: NodeSpec, index: int) -> None:
    device_dir = sys_root / "class" / "infiniband" / name
    port = device_dir / "ports" / "1"
    down = index == spec.down_ib_device
    write(port / "state", "1: DOWN\n" if down else "4: ACTIVE\n")
    write(port / "phys_state", "2: Polling\n" if down else "5: LinkUp\n")
    write(port / "rate", "10 Gb/sec (4X SDR)\n" if down else "400 Gb/sec (4X NDR)\n")
    write(port / "link_layer", "InfiniBand\n")
    write(port / "lid", "0x1b\n")
    for k, counter in enumerate(IB_COUNTERS):
        value = "N/A (no PMA)" if index == spec.no_pma_device else str(spec.counter_base * (index + 1) + k)
        write(port / "counters" / counter, value + "\n")
    for k, counter in enumerate(IB_HW_COUNTERS):
        write(port / "hw_counters" / counter, f"{'10' if counter == 'lifespan' else k * (index + 1)}\n")
    link = device_dir / "device"
    if spec.topology:
        link.symlink_to(os.path.relpath(pci_dir, device_dir))
    else:
        link.write_text(pci_dir.name + "\n")


def build_lustre(proc_root: Path, oscs: int) -> None:
    src = FIXTURES / "lustre" / "proc" / "fs" / "lustre"
    lustre = proc_root / "fs" / "lustre"
    llite = (src / "llite" / "scratch-ffff8f0a1b2c3000" / "stats").read_text()
    write(lustre / "llite" / "scratch-ffff8f0a1b2c3000" / "stats", llite)
    osc_dir = src / "osc" / "scratch-OST0000-osc-ffff8f0a1b2c3000"
    osc_stats, rpc_stats = (osc_dir / "stats").read_text(), (osc_dir / "rpc_stats").read_text()
    for n in range(oscs):
        target = lustre / "osc" / f"scratch-OST{n:04x}-osc-ffff8f0a1b2c3000"
        write(target / "stats", osc_stats)
        write(target / "rpc_stats", rpc_stats)
    mdc = (src / "mdc" / "scratch-MDT0000-mdc-ffff8f0a1b2c3000" / "stats").read_text()
    write(lustre / "mdc" / "scratch-MDT0000-mdc-ffff8f0a1b2c3000" / "stats", mdc)


# -- exposition ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition, keyed by (name, labels); parsed once per text (tests ask one
    exposition many questions). Callers must not modify the result."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels`` (None if none; fails if
    several match)."""
    matches = [v for (n, ls), v in samples(text).items() if n == name and set(labels.items()) <= set(ls)]
    assert len(matches) <= 1, f"{len(matches)} samples of {name} match {labels}"
    return matches[0] if matches else None


def names(text: str) -> set[str]:
    return {name for name, _ in samples(text)}


def promtool_check_metrics(text: str) -> None:
    """Fails unless ``promtool check metrics`` (the Debian prometheus package) finds nothing to say
    about an exposition: no lint problem, no parse error."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (apt-get install prometheus; see shared/STACK.md)"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    problems = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not problems, f"promtool check metrics:\n{problems}"


# -- a small real HTTP server speaking JSON --------------------------------------------------------


@dataclass
class Behaviour:
    """How the server answers: normally, slowly, with garbage or with an error status."""

    delay_s: float = 0.0
    garbage: bool = False
    status: int = 200
    requests: list[str] = field(default_factory=list)


class JsonServer:
    """Serves ``routes`` (path -> JSON-able body, or text) on 127.0.0.1 on a free port, optionally
    behind HTTP basic auth. Real sockets and a real HTTP stack: the code under test is not patched."""

    def __init__(
        self, routes: dict[str, object], credentials: tuple[str, str] | None = None, prefix: str = ""
    ) -> None:
        self.routes = routes
        self.behaviour = Behaviour()
        expected = None
        if credentials:
            expected = "Basic " + base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                outer.behaviour.requests.append(path)
                if outer.behaviour.delay_s:
                    time.sleep(
                        outer.behaviour.delay_s
                    )  # the server is slow: that is the behaviour under test
                if expected and self.headers.get("Authorization") != expected:
                    return self._send(401, b'{"error": "unauthorized"}')
                if prefix and not path.startswith(prefix):
                    return self._send(404, b"{}")
                body = outer.routes.get(path[len(prefix) :]) if prefix else outer.routes.get(path)
                if body is None:
                    return self._send(404, b'{"error": "not found"}')
                if outer.behaviour.garbage:
                    return self._send(200, b"<html>\x00\xff not json")
                raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self._send(outer.behaviour.status, raw)

            def _send(self, code: int, raw: bytes) -> None:
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): fine

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def load_routes(name: str) -> dict[str, object]:
    return json.loads((FIXTURES / "redfish" / name).read_text())


def bmc_agent(tmp_path: Path, **options) -> NodeAgent:
    """A node agent running only the BMC collector (no NVML; its sysfs, procfs and kmsg under tmp_path)."""
    return NodeAgent(
        NodeOptions(
            node="n0001",
            sysfs_root=str(tmp_path / "sys"),
            procfs_root=str(tmp_path / "proc"),
            kmsg_file=str(tmp_path / "kern.log"),
            nvml=False,
            collectors=("bmc",),
            bmc_interval_s=options.pop("bmc_interval_s", 0.0),
            **options,
        )
    )
