"""The dcgm-exporter contract: FleetSight's counters file, the names it reads, and the twin's /metrics,
held to dcgm-exporter's and go-dcgm's own files (vendored in exporters/dcgm/upstream/, PROVENANCE.md).

Upstream sources the expectations below are written from (NVIDIA/dcgm-exporter at tag 4.4.2-4.7.0 =
54267f29ee8037d15fdd55e9c0c65f99577d9990, the image FleetSight pins):
- internal/pkg/rendermetrics/render_metrics.go, gpuMetricsFormat: ``gpu, UUID, pci_bus_id, device,
  modelName, [GPU_I_PROFILE, GPU_I_ID,] Hostname``, then ``Labels`` sorted, then ``Attributes`` sorted;
- internal/pkg/collector/gpu_collector.go toMetric: ``label`` counters go to Labels; the Xid field
  (DCGM_FI_DEV_XID_ERRORS) gets Attributes ``err_code`` (the value) and ``err_msg``
  (xidErrCodeToText[value], ``No Error`` for 0);
- internal/pkg/transformation/kubernetes.go Process: ``pod``, ``namespace``, ``container`` and
  ``pod_uid`` (always set there, empty without --kubernetes-enable-pod-uid) on GPUs a pod holds; pod
  labels copied into Labels, keys through utils.SanitizeLabelName (``[^a-zA-Z0-9_]`` -> ``_``);
- internal/pkg/transformation/hpc.go: ``hpc_job`` on GPUs a job-mapping file assigns.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetsight import dcgm as fsdcgm
from twin import dcgm
from twin.scenario import dcgm_settings, load
from twin.sim import Simulation

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm"
SCENARIO = ROOT / "tests" / "twin" / "scenarios" / "xid.yaml"  # 5 nodes, one 4-node job from t=0
IDENTITY = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)  # the `label` records of both counters files
KUBERNETES = ("container", "namespace", "pod", "pod_uid")
MIG = {"GPU_I_PROFILE", "GPU_I_ID"}  # only on MIG instances; the twin's H100s run without MIG
FIELD_NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]*[A-Z0-9]\b")
# Where FleetSight reads DCGM fields (the twin and the counters file itself excluded: they publish).
READERS = (
    "rules/*.yml",
    "anomaly/**/*.py",
    "health/**/*.py",
    "dashboards/*.json",
    "dashboards/*.py",
    "evaluation/**/*.py",
    "bench/**/*.py",
    "docs/runbooks/*.md",
)


def names(path: Path) -> list[str]:
    return [c.field for c in fsdcgm.read_counters(path)]


def sim_after(ticks: int, **settings: object) -> Simulation:
    scenario = load(SCENARIO)
    scenario = replace(scenario, dcgm=dcgm_settings(settings))
    sim = Simulation(scenario, scenario.start)
    for _ in range(ticks):
        sim.advance()
    return sim


@pytest.fixture(scope="module")
def busy() -> Simulation:
    """Four minutes in: job 2001 runs on n0001..n0004, n0005 is idle."""
    return sim_after(48)


def page_keys(page: str) -> dict[str, list[tuple[str, ...]]]:
    """Each metric's label keys per series, in the order the page writes them."""
    out: dict[str, list[tuple[str, ...]]] = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            keys = tuple(re.findall(r'(?:^|,)([A-Za-z_][A-Za-z0-9_]*)="', rest.rpartition("}")[0]))
            out.setdefault(name, []).append(keys)
    return out


def render(sim: Simulation, node: str, **settings: object) -> str:
    sim.scenario = replace(sim.scenario, dcgm=dcgm_settings(settings))
    return dcgm.metrics(sim, sim.node_index[node])


# ---------------------------------------------------------------------------------- counters file


@pytest.mark.parametrize("table", [fsdcgm.PINNED_FIELDS, fsdcgm.NEWEST_FIELDS], ids=["pinned", "newest"])
def test_every_shipped_name_resolves_so_the_exporter_starts(table: Path) -> None:
    """dcgm-exporter's counter_config.go refuses a name dcgm.GetFieldID does not know (current or legacy)."""
    known = fsdcgm.read_field_table(table)
    assert [n for n in names(fsdcgm.SHIPPED_COUNTERS) if n not in known] == []


def test_the_shipped_file_keeps_every_stock_record() -> None:
    shipped = {(c.field, c.prom_type) for c in fsdcgm.read_counters(fsdcgm.SHIPPED_COUNTERS)}
    stock = {(c.field, c.prom_type) for c in fsdcgm.read_counters(fsdcgm.STOCK_COUNTERS)}
    assert stock - shipped == set()
    assert len(names(fsdcgm.SHIPPED_COUNTERS)) == len(set(names(fsdcgm.SHIPPED_COUNTERS))), "a field twice"


def test_a_name_no_go_dcgm_knows_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "# one known, one unknown\nDCGM_FI_DEV_SM_CLOCK, gauge, x\nDCGM_FI_DEV_NO_SUCH, gauge, y\n"
    )
    with pytest.raises(ValueError, match="DCGM_FI_DEV_NO_SUCH"):
        dcgm.load_fields(str(bad))


def read_names() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for pattern in READERS:
        for path in ROOT.glob(pattern):
            for name in FIELD_NAME.findall(path.read_text(errors="replace")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_field_fleetsight_reads_is_real_and_shipped() -> None:
    """A name a rule, dashboard, service or runbook reads is a DCGM field (some go-dcgm table knows it) and
    the shipped counters file publishes it under one of its names (fleetsight.dcgm.names_of)."""
    found = read_names()
    assert "DCGM_FI_DEV_POWER_USAGE" in found, "the scan finds nothing: the globs are wrong"
    unknown = {n: sorted(p) for n, p in found.items() if fsdcgm.field_id(n) is None}
    assert unknown == {}
    shipped = set(names(fsdcgm.SHIPPED_COUNTERS))
    unpublished = {n: sorted(p) for n, p in found.items() if not shipped & set(fsdcgm.names_of(n))}
    assert unpublished == {}


def test_aliases_name_one_field_each() -> None:
    """ALIASES groups names go-dcgm gives one field id; the first is what the shipped file says."""
    shipped = set(names(fsdcgm.SHIPPED_COUNTERS))
    for first, group in fsdcgm.ALIASES.items():
        assert group[0] == first and first in shipped
        assert {fsdcgm.field_id(n) for n in group} == {fsdcgm.field_id(first)} != {None}


def test_compose_and_chart_ship_the_same_file() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["dcgm-exporter"]
    mount = next(v for v in compose["volumes"] if v.startswith("./exporters/dcgm/counters.csv:"))
    assert compose["environment"]["DCGM_EXPORTER_COLLECTORS"] == mount.split(":")[1]
    chart_copy = ROOT / "deploy/helm/fleetsight/files/dcgm-counters.csv"
    assert chart_copy.read_bytes() == fsdcgm.SHIPPED_COUNTERS.read_bytes()


# ---------------------------------------------------------------------------------- the twin


@pytest.mark.parametrize("counters", ["shipped", "stock"])
def test_the_twin_publishes_exactly_the_counters_file(busy: Simulation, counters: str) -> None:
    path = dcgm.counters_path(counters)
    page = render(busy, "n0002", counters=counters)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
    expected = {c.field: c.prom_type for c in fsdcgm.read_counters(path) if c.prom_type != "label"}
    assert types == expected
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", page, re.M))
    assert helps == {c.field: c.help for c in fsdcgm.read_counters(path) if c.prom_type != "label"}
    assert set(page_keys(page)) == set(expected), "every field has series on a healthy node"
    families = {f.name for f in text_string_to_metric_families(page)}
    assert len(families) == len(expected), "prometheus_client parses every family"


def test_bare_metal_labels(busy: Simulation) -> None:
    page = page_keys(render(busy, "n0002", labels="bare"))
    assert page["DCGM_FI_DEV_SM_CLOCK"] == [IDENTITY + LABEL_FIELDS] * 8
    assert page["DCGM_FI_DEV_XID_ERRORS"] == [IDENTITY + LABEL_FIELDS + ("err_code", "err_msg")] * 8


def test_slurm_labels_only_on_a_jobs_gpus(busy: Simulation) -> None:
    held = page_keys(render(busy, "n0002", labels="slurm"))
    assert held["DCGM_FI_DEV_SM_CLOCK"] == [IDENTITY + LABEL_FIELDS + ("hpc_job",)] * 8
    assert held["DCGM_FI_DEV_XID_ERRORS"][0] == IDENTITY + LABEL_FIELDS + ("err_code", "err_msg", "hpc_job")
    idle = page_keys(render(busy, "n0005", labels="slurm"))
    assert idle["DCGM_FI_DEV_SM_CLOCK"] == [IDENTITY + LABEL_FIELDS] * 8


def test_kubernetes_labels(busy: Simulation) -> None:
    held = page_keys(render(busy, "n0002", labels="kubernetes"))
    assert held["DCGM_FI_DEV_SM_CLOCK"][0] == IDENTITY + LABEL_FIELDS + KUBERNETES
    xid = held["DCGM_FI_DEV_XID_ERRORS"][0]
    assert xid == IDENTITY + LABEL_FIELDS + (
        "container",
        "err_code",
        "err_msg",
        "namespace",
        "pod",
        "pod_uid",
    )
    idle = page_keys(render(busy, "n0005", labels="kubernetes"))
    assert idle["DCGM_FI_DEV_SM_CLOCK"][0] == IDENTITY + LABEL_FIELDS


def test_kubernetes_pod_labels_are_sanitised(busy: Simulation) -> None:
    text = render(busy, "n0002", labels="kubernetes", pod_labels=True, pod_uid=True)
    keys = page_keys(text)["DCGM_FI_DEV_SM_CLOCK"][0]
    pod_labels = keys[len(IDENTITY) + 1 : -len(KUBERNETES)]
    assert "jobset_sigs_k8s_io_jobset_name" in pod_labels and list(pod_labels) == sorted(pod_labels)
    assert all(re.fullmatch(r"[a-zA-Z0-9_]+", k) for k in pod_labels)
    assert 'jobset_sigs_k8s_io_jobset_name="llm-20b-pretrain"' in text
    assert re.search(r'pod_uid="[0-9a-f-]{36}"', text), "--kubernetes-enable-pod-uid fills pod_uid"
    assert dcgm.sanitize_label_name("jobset.sigs.k8s.io/jobset-name") == "jobset_sigs_k8s_io_jobset_name"


def xid_lines(text: str, gpu: int) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("DCGM_FI_DEV_XID_ERRORS{") and f'gpu="{gpu}"' in line
    ]


def test_xid_4x_and_3x(busy: Simulation) -> None:
    node = busy.node_index["n0002"]
    never = xid_lines(render(busy, "n0002"), 3)
    assert len(never) == 1 and 'err_code="0",err_msg="No Error"' in never[0] and never[0].endswith("} 0")
    saved = busy.xid_last[node, 3]
    try:
        busy.xid_last[node, 3] = 79
        now = xid_lines(render(busy, "n0002"), 3)
        assert 'err_code="79",err_msg="GPU has fallen off the bus"' in now[0] and now[0].endswith("} 79")
        busy.xid_last[node, 3] = 200  # past xidErrCodeToText
        assert 'err_code="200",err_msg="Unknown Error"' in xid_lines(render(busy, "n0002"), 3)[0]
        old = xid_lines(render(busy, "n0002", xid="3x"), 3)
        assert "err_code" not in old[0] and old[0].endswith("} 200")
    finally:
        busy.xid_last[node, 3] = saved


def test_values_are_formatted_as_dcgm_exporter_does(busy: Simulation) -> None:
    """toString: integers %d, doubles %f."""
    text = render(busy, "n0002")
    power = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_POWER_USAGE{"))
    clock = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    assert re.search(r"} \d+\.\d{6}$", power) and re.search(r"} \d+$", clock)


# ---------------------------------------------------------------------------------- real captures


def capture_keys(name: str) -> list[tuple[str, ...]]:
    return [k for keys in page_keys((FIXTURES / name).read_text()).values() for k in keys]


def test_kubernetes_labels_match_a_real_capture(busy: Simulation) -> None:
    """The H100 capture (dcgm-exporter issue #512): a pod's GPU and an unheld GPU. Its release predates
    pod_uid; MIG adds GPU_I_* (the twin has no MIG)."""
    held, unheld, _ = ([k for k in keys if k not in MIG] for keys in capture_keys("h100-kubernetes-mig.prom"))
    twin = page_keys(render(busy, "n0002", labels="kubernetes"))["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][0]
    assert [k for k in twin if k != "pod_uid"] == held
    idle = page_keys(render(busy, "n0005", labels="kubernetes"))["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][0]
    assert list(idle) == unheld


def test_3x_xid_labels_match_a_real_capture(busy: Simulation) -> None:
    """The A30 capture (issue #317): a 3.x Xid series has no err_code/err_msg. That release and counters
    file wrote neither pci_bus_id nor the driver label, which the pinned release does."""
    real = [k for k in capture_keys("a30-xid-3x.prom")[0] if k not in MIG]
    twin = page_keys(render(busy, "n0005", labels="bare", xid="3x"))["DCGM_FI_DEV_XID_ERRORS"][0]
    assert [k for k in twin if k not in ("pci_bus_id", "DCGM_FI_DRIVER_VERSION")] == real


def test_modes_are_checked_where_they_are_set(tmp_path: Path) -> None:
    from twin.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"dcgm\.xid"):
        dcgm_settings({"xid": "5x"})
    with pytest.raises(ScenarioError, match=r"dcgm\.labels"):
        dcgm_settings({"labels": "lsf"})
    with pytest.raises(ScenarioError, match=r"dcgm\.counters"):
        dcgm_settings({"counters": str(tmp_path / "missing.csv")})
    assert dcgm_settings(None) == dcgm_settings({"counters": "shipped", "xid": "4x", "labels": "slurm"})
