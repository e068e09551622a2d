"""The recorded window (rules/anomaly.yml): the rule file is the service's own reductions, and on a real
Prometheus the recorded mode reads the same window as the raw queries, field for field, jobs and models
included; without the rules the service reads raw and says so.

History, not scrapes: the series are backfilled with promtool (`create-blocks-from openmetrics`), and the
rules with promtool too (`create-blocks-from rules`, evaluated by that Prometheus at the group's 15 s
steps), so both modes are read at a rule evaluation's own timestamp over data that no longer changes."""

from __future__ import annotations

import http.server
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from anomaly_helpers import stop

from anomaly.cause import cause_of
from anomaly.queries import Queries
from anomaly.source import PrometheusSource, SourceError
from anomaly.state import DetectorConfig
from anomaly.window import EVIDENCE_FIELDS, NODE_EVIDENCE_FIELDS, Window
from support import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules" / "anomaly.yml"
STEP_S = 5  # the dcgm scrape interval the history is written at
HISTORY_S = 150
FIELDS = ("tensor", "power", "sm_clock", "util", "brake", "thermal", "pcie_downgraded", "h2d_bandwidth")
CURRENT, LEGACY = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


def test_the_rule_file_is_the_services_reductions() -> None:
    """rules/anomaly.yml records exactly what Queries().recording_rules() says (the raw queries, per GPU),
    under the names the recorded mode reads, in one group evaluated once per 30 s cycle."""
    group = yaml.safe_load(RULES.read_text())["groups"]
    assert len(group) == 1 and group[0]["interval"] == "30s"
    recorded = {r["record"]: " ".join(r["expr"].split()) for r in group[0]["rules"]}
    queries = Queries()
    assert recorded == queries.recording_rules()
    assert set(queries.record_names().values()) == set(recorded)
    names, raw = queries.record_names(), queries.gpu_fields()
    for key in ("tensor", "power", "sm_clock"):  # each record wraps the service's raw query
        assert recorded[names[key]] == f"max by (cluster, node, gpu) ({raw[key]})", key
    for key in ("brake", "thermal"):  # the same bits, of one series per GPU kept by (cluster, node, gpu)
        per_gpu = raw[key].replace("max without ()", "max by (cluster, node, gpu)")
        assert recorded[names[key]] == f"{per_gpu} > 0", key
    assert not {*EVIDENCE_FIELDS, *NODE_EVIDENCE_FIELDS} & set(names)  # read raw, for a flag's nodes only
    assert not Queries(window="60s").recordable and Queries().recordable


def gpu_labels(node: str, gpu: int) -> dict[str, str]:
    labels = {"cluster": "c1", "node": node, "Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"}
    labels["modelName"] = "NVIDIA H100 80GB HBM3"
    if node == "n03":  # a JobSet's pod (Kubernetes), the others a Slurm job by hpc_job
        # a MoE job that says it routes experts (anomaly/declared.py): the pod label, sanitised
        labels.update(namespace="team-a", jobset_sigs_k8s_io_jobset_name="pretrain")
        labels.update(fleetsight_io_expert_routing="true")
    else:
        labels["hpc_job"] = "42"
    return labels


def gpu_series(t: int) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every GPU field at offset t: values that move within a window, throttle
    bits on some samples, the clock events under either name (n03 GPU 0 under both), a downgraded link."""
    out = []
    for n, node in enumerate(("n01", "n02", "n03")):
        for gpu in range(2):
            labels = gpu_labels(node, gpu)
            wobble = ((t // STEP_S) * 7 + n * 3 + gpu) % 5
            out += [
                ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, 0.40 + 0.01 * wobble + 0.1 * n),
                ("DCGM_FI_DEV_POWER_USAGE", labels, 500.0 + 3 * wobble - 40 * gpu),
                ("DCGM_FI_DEV_SM_CLOCK", labels, 1980.0 - 15 * wobble),
                ("DCGM_FI_DEV_GPU_UTIL", labels, 90.0 + wobble),
                (
                    "fleetsight_pcie_link_downgraded",
                    {"node": node, "gpu": str(gpu), "kind": "gpu"},
                    1.0 if (node, gpu) == ("n02", 0) else 0.0,
                ),
                (
                    "fleetsight_pcie_host_to_device_bandwidth_bytes_per_second",
                    {"node": node, "gpu": str(gpu)},
                    2.5e10 - 1e9 * wobble,
                ),
            ]
            brake = 0x80 if (node, gpu) == ("n01", 0) and (t // STEP_S) % 3 else 0
            thermal = 0x40 if node != "n01" and gpu == 1 and (t // STEP_S) % 2 else 0
            names = (
                (CURRENT, LEGACY)
                if (node, gpu) == ("n03", 0)
                else ((LEGACY,) if node == "n02" else (CURRENT,))
            )
            out += [(name, labels, float(brake | thermal | 0x4)) for name in names]
    return out


def node_series(t: int) -> list[tuple[str, dict[str, str], float]]:
    """The IB counters. A node's errors are above 0 in every window or in none: promtool's rule backfill
    writes no staleness marker when a sparse record falls back to 0 (a running Prometheus does, and
    test_a_share_back_at_zero_reads_as_zero_at_once_... checks that path live), so a window that had errors
    would still be read for RECORDED_FRESH after, wherever the group's offset (a hash of the rule
    file's path) happens to fall."""
    out = []
    for n, node in enumerate(("n01", "n02", "n03")):
        for port in ("mlx5_0", "mlx5_1"):
            labels = {"cluster": "c1", "node": node, "device": port, "port": "1"}
            k = t // STEP_S
            out += [
                (
                    "fleetsight_infiniband_port_symbol_error_total",
                    labels,
                    float(k * 4 if node == "n03" else 0),
                ),
                (  # n02 goes down every 25 s, so every 30 s window holds one (see node_series)
                    "fleetsight_infiniband_port_link_downed_total",
                    labels,
                    float(k // 5 if node == "n02" else 0),
                ),
                ("fleetsight_infiniband_port_link_error_recovery_total", labels, 0.0),
                ("fleetsight_infiniband_port_xmit_wait_total", labels, float(k * (1000 + 100 * n))),
                ("fleetsight_infiniband_port_rcv_data_bytes_total", labels, float(k * (4e9 + 1e8 * n))),
            ]
    return out


def openmetrics(start: int) -> str:
    """The history as OpenMetrics text: each family's samples together, every series in time order."""
    families: dict[str, list[str]] = {}
    for t in range(0, HISTORY_S + 1, STEP_S):
        for name, labels, value in gpu_series(t) + node_series(t):
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            families.setdefault(name, []).append((text, f"{name}{{{text}}} {value} {start + t}"))
    lines = []
    for name, samples in families.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [line for _, line in sorted(samples, key=lambda s: s[0])]  # stable: series, then time
    return "\n".join(lines) + "\n# EOF\n"


def start(tsdb: Path, port: int) -> subprocess.Popen[bytes]:
    config = tsdb.parent / "prometheus.yml"
    config.write_text("global: {}\n")
    return subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def ready(url: str) -> bool:
    source = PrometheusSource(url)
    try:
        source.query("vector(1)")
        return True
    except SourceError:
        return False
    finally:
        source.close()


def evaluated_at(source: PrometheusSource, t: float) -> float:
    """The time of the last rule evaluation up to t: a group evaluates at its own offset within the
    interval (Prometheus and promtool alike), and the window a recorded value holds ends there."""
    answer = source.query('timestamp(gpu:dcgm_tensor_active:median30s{node="n01", gpu="0"})', t)
    return float(answer[0]["value"][1])


def assert_same_window(raw: Window, recorded: Window) -> None:
    assert recorded.nodes == raw.nodes == ["n01", "n02", "n03"]
    assert recorded.gpus == raw.gpus == 2
    for key in (*FIELDS, "ib_errors", "ib_xmit_wait", "ib_rcv_rate"):
        np.testing.assert_array_equal(getattr(recorded, key), getattr(raw, key), err_msg=key)
    assert recorded.jobs == raw.jobs == {"42": [0, 1], "team-a/pretrain": [2]}
    assert recorded.job_refs == raw.job_refs
    assert recorded.job_refs["team-a/pretrain"].declared_routing  # the recorded job labels keep it
    assert not recorded.job_refs["42"].declared_routing
    assert recorded.gpu_model == raw.gpu_model and recorded.node_cluster == raw.node_cluster


def test_both_modes_read_the_same_window_and_say_which(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    begin = int(time.time()) // 60 * 60 - 3600  # an hour ago, on a minute
    (tmp_path / "history.om").write_text(openmetrics(begin))
    tsdb = tmp_path / "tsdb"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "history.om"),
                    str(tsdb)], check=True, capture_output=True)  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prometheus = start(tsdb, port)
    try:
        wait_until(lambda: ready(url), timeout=60, what="Prometheus with the history")
        at = begin + 90.0
        caplog.set_level(logging.INFO, logger="anomaly")
        auto = PrometheusSource(url)
        raw = auto.read(at)
        assert auto.mode_now == "raw" and '"mode": "raw"' in caplog.text  # no rules loaded: raw, logged
        with pytest.raises(SourceError, match="no recorded window"):
            PrometheusSource(url, mode="recorded").read(at)
        assert raw.brake[0, 0] > 0 and raw.thermal[1, 1] > 0 and raw.pcie_downgraded[1, 0] == 1
        assert raw.ib_errors[2] > 0 and raw.ib_errors[1] >= 0 and raw.ib_xmit_wait.min() > 0
        assert np.all(np.diff(raw.ib_rcv_rate) > 0)  # bytes received per second, per node as published

        subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", f"--url={url}", f"--start={begin}",
                        f"--end={begin + HISTORY_S}", f"--output-dir={tmp_path / 'rules'}", str(RULES)],
                       check=True, capture_output=True)  # fmt: skip
        stop(prometheus)
        for block in (tmp_path / "rules").iterdir():  # the recorded blocks join the history
            shutil.move(str(block), tsdb / block.name)
        prometheus = start(tsdb, port)
        wait_until(lambda: ready(url), timeout=60, what="Prometheus with the recorded window")
        for t in (
            evaluated_at(auto, at),
            evaluated_at(auto, begin + 60.0),
            evaluated_at(auto, begin + 140.0),
        ):
            recorded = auto.read(t)
            assert auto.mode_now == "recorded"
            # Evidence-only fields are not read with the window, but on demand for a flag's nodes.
            assert all(
                np.isnan(getattr(recorded, key)).all() for key in (*EVIDENCE_FIELDS, *NODE_EVIDENCE_FIELDS)
            )
            recorded.load_evidence([0, 2])
            assert np.isfinite(recorded.util[[0, 2]]).all() and np.isnan(recorded.util[1]).all()
            assert np.isfinite(recorded.ib_rcv_rate[[0, 2]]).all() and np.isnan(recorded.ib_rcv_rate[1])
            raw = PrometheusSource(url, mode="raw").read(t)
            # A flag's explanation loads what it quotes: the same evidence as from the raw window.
            cfg = DetectorConfig()
            assert cause_of(cfg, recorded, [0, 1], 1, 0, 5.0) == cause_of(cfg, raw, [0, 1], 1, 0, 5.0)
            recorded.load_evidence([0, 1, 2])
            assert_same_window(raw, recorded)
        assert '"mode": "recorded"' in caplog.text
    finally:
        stop(prometheus)


class BrakeExporter:
    """One node's two GPUs as dcgm-exporter publishes them, GPU 0's power-brake bit switchable."""

    def __init__(self) -> None:
        self.brake = True
        handler = self._handler()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def page(self) -> bytes:
        lines = []
        for gpu in (0, 1):
            labels = f'gpu="{gpu}",node="n01",cluster="c1",hpc_job="42",modelName="NVIDIA H100 80GB HBM3"'
            reasons = 0x84 if self.brake and gpu == 0 else 0x4
            lines += [f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.45",
                      f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 600",
                      f"{CURRENT}{{{labels}}} {reasons}"]  # fmt: skip
        return ("\n".join(lines) + "\n").encode()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.page()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def test_a_share_back_at_zero_reads_as_zero_at_once_though_it_is_no_longer_recorded(tmp_path: Path) -> None:
    """Live: throttle shares are recorded only where above 0, so a brake that ends stops being written;
    the recorded read sees it gone with the rule's staleness marker, not a minute later (the dense
    fields' last_over_time would). The group runs every 2 s here instead of 30 s; the window is 30 s."""
    exporter = BrakeExporter()
    group = yaml.safe_load(RULES.read_text())
    group["groups"][0]["interval"] = "2s"
    (tmp_path / "anomaly.yml").write_text(yaml.safe_dump(group))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "2s"},
        "rule_files": [str(tmp_path / "anomaly.yml")],
        "scrape_configs": [{"job_name": "dcgm", "honor_labels": True,
                            "static_configs": [{"targets": [exporter.address]}]}],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    source = PrometheusSource(url, mode="recorded")
    try:
        wait_until(lambda: ready(url), timeout=60, what="Prometheus")

        def brake_share() -> float | None:
            try:
                window = source.read()
            except SourceError:
                return None  # nothing recorded yet
            return float(window.brake[0, 0]) if window.nodes == ["n01"] else None

        wait_until(lambda: (brake_share() or 0) > 0.5, timeout=60, what="the brake's share recorded")
        assert source.read().brake[0, 1] == 0  # GPU 1 never braked: not recorded, read as 0
        exporter.brake = False
        wait_until(lambda: brake_share() == 0.0, timeout=60, what="the ended brake read as 0")
        lingering = source.query("last_over_time(gpu:dcgm_power_brake:share30s[1m])")
        assert lingering, "the last recorded share is still within a minute: only staleness ended it"
    finally:
        source.close()
        stop(prometheus)
        exporter.server.shutdown()
