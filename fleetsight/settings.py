"""Where things live and which ports the local stack uses.

Everything is overridable by environment variables so that tests (and two stacks on one machine)
can run side by side: ``FLEETSIGHT_RUN_DIR``, ``FLEETSIGHT_CACHE_DIR``, ``FLEETSIGHT_PORT_BASE``, and
``FLEETSIGHT_CLUSTER``, the one name of the stack's cluster: the twin's nodes carry it as their `cluster`
target label, Prometheus as its external label (so every alert and every series seen through Thanos),
the health and checks services in their records and metrics, the log pipeline in every document.

What the stack's twin runs, set by `fleetsight up --scenario` (and for each cluster of `up --clusters`):
``FLEETSIGHT_TWIN_SCENARIO`` (a scenario file or a shipped scenario's name; default the demo) and
``FLEETSIGHT_SCHEDULER`` (``slurm`` or ``kubernetes``: how the cluster's jobs are known, from its
scenario). ``FLEETSIGHT_SLACK_STAND_IN_URL`` sends the stack's alerts to another stack's Slack stand-in
(every cluster of `up --clusters` posts to the global layer's one). ``FLEETSIGHT_READY_PATIENCE``
multiplies each component's time to get ready (1 to 10, default 1: for a busy machine).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_PORT_BASE = 19000
DEFAULT_CLUSTER = "demo"  # the name of the demo scenario's cluster (twin/scenarios/demo.yaml)
# A label value, a file-name part and a URL path segment alike: letters, digits, '.', '_', '-'.
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# Where a job's identity comes from: the `scheduler` label of the anomaly service's
# fleetsight_job_node_info, which the health service reads back (anomaly/jobs.py, health/jobs.py):
# slurmrestd, dcgm-exporter's hpc_job label (a Slurm id without slurmrestd), or Kubernetes.
SLURM = "slurm"
HPC_JOB_LABEL = "hpc_job-label"
KUBERNETES = "kubernetes"
SCHEDULERS = (SLURM, KUBERNETES)  # what the stack's --scheduler can name
TWIN_SCENARIO_ENV = "FLEETSIGHT_TWIN_SCENARIO"
SCHEDULER_ENV = "FLEETSIGHT_SCHEDULER"
SLACK_STAND_IN_ENV = "FLEETSIGHT_SLACK_STAND_IN_URL"
READY_PATIENCE_ENV = "FLEETSIGHT_READY_PATIENCE"


def _ready_patience() -> float:
    value = os.environ.get(READY_PATIENCE_ENV, "1")
    try:
        patience = float(value)
    except ValueError:
        patience = 0.0
    if not 1.0 <= patience <= 10.0:
        raise ValueError(f"{READY_PATIENCE_ENV}={value!r}: a factor from 1 to 10 (1: each component's own)")
    return patience


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


@dataclass(frozen=True)
class Settings:
    """Paths and ports of one local stack."""

    repo_root: Path = REPO_ROOT
    run_dir: Path = field(default_factory=lambda: _env_path("FLEETSIGHT_RUN_DIR", REPO_ROOT / "run"))
    cache_dir: Path = field(default_factory=lambda: _env_path("FLEETSIGHT_CACHE_DIR", REPO_ROOT / ".cache"))
    port_base: int = field(
        default_factory=lambda: int(os.environ.get("FLEETSIGHT_PORT_BASE", DEFAULT_PORT_BASE))
    )
    host: str = "127.0.0.1"
    cluster: str = field(default_factory=lambda: os.environ.get("FLEETSIGHT_CLUSTER") or DEFAULT_CLUSTER)
    twin_scenario: str = field(default_factory=lambda: os.environ.get(TWIN_SCENARIO_ENV, ""))
    """The twin's scenario (a path or a shipped name); empty: the demo."""
    scheduler: str = field(default_factory=lambda: os.environ.get(SCHEDULER_ENV) or SCHEDULERS[0])
    ready_patience: float = field(default_factory=_ready_patience)
    """Each component's time to get ready is multiplied by this (``FLEETSIGHT_READY_PATIENCE``): on a
    loaded 2-core machine a Python service's imports alone took 58 s (9 s idle) while two stacks
    started, and the anomaly service's 60 s ran out."""

    def __post_init__(self) -> None:
        if not CLUSTER_NAME.match(self.cluster):
            raise ValueError(
                f"cluster name {self.cluster!r} (FLEETSIGHT_CLUSTER): use 1-63 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit"
            )
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"{SCHEDULER_ENV}={self.scheduler!r}: expected one of {', '.join(SCHEDULERS)}")

    def port(self, name: str) -> int:
        """The port named ``name`` by a component's ``PORTS`` (an offset from the base)."""
        from fleetsight.registry import port_offsets  # late: the registry imports component modules

        offsets = port_offsets()
        if name not in offsets:
            raise KeyError(
                f"no component declares a port named {name!r} (known: {', '.join(sorted(offsets))})"
            )
        return self.port_base + offsets[name]

    def url(self, name: str, path: str = "") -> str:
        return f"http://{self.host}:{self.port(name)}{path}"

    @property
    def bin_dir(self) -> Path:
        """Binaries that setup builds or downloads (Thanos, ...)."""
        return self.cache_dir / "bin"

    def data_dir(self, component: str) -> Path:
        return self.run_dir / "data" / component

    def log_file(self, component: str) -> Path:
        return self.run_dir / "logs" / f"{component}.log"

    def config_dir(self, component: str) -> Path:
        return self.run_dir / "config" / component
