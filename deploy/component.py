"""Deployment artefacts of FleetSight: the Helm chart (deploy/helm/fleetsight) and the tools its tests
need, which ``fleetsight setup`` installs: helm, kube-apiserver, kube-controller-manager, kube-scheduler
and kwok built from their Go modules (see :mod:`deploy.tools`), etcd from Debian. No supervised process
of its own. The Debian packages and hardened systemd units (deploy/debian, deploy/systemd) and the
Slurm hooks (deploy/slurm) add the tools that build and check them."""

from __future__ import annotations

from fleetsight.setup import InstallStep, apt_step

from .debian.install import DEBIAN_STEPS
from .tools import (
    HELM,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KUBERNETES_VERSION,
    KWOK,
    OPERATOR_CRDS_STEP,
)

CLI = {
    "licences": (
        ".licences",
        "the licence of everything setup and the packages bring in; fails on a denied one",
    )
}

NEEDED_BY = "the Helm chart's tests and the health service's Kubernetes sync tests (tests/deploy)"

INSTALL_STEPS = [
    apt_step(
        "etcd", "etcd (Debian's etcd-server): the test API server's store", NEEDED_BY, {"etcd-server": "etcd"}
    ),
    HELM.install_step(
        "helm", f"helm {HELM.module_version}, built from its Go module", NEEDED_BY, "~3 min cold (2 cores)"
    ),
    KUBE_APISERVER.install_step(
        "kube-apiserver",
        f"kube-apiserver {KUBERNETES_VERSION}, built in a wrapper Go module (staging modules mapped)",
        NEEDED_BY,
        "~6-10 min cold (2 cores), ~1 min with warm Go caches",
    ),
    KUBE_CONTROLLER_MANAGER.install_step(
        "kube-controller-manager",
        f"kube-controller-manager {KUBERNETES_VERSION} (DaemonSet and taint-eviction controllers)",
        NEEDED_BY,
        "~2-4 min cold after kube-apiserver (shared packages)",
    ),
    KUBE_SCHEDULER.install_step(
        "kube-scheduler",
        f"kube-scheduler {KUBERNETES_VERSION}: places the DaemonSet's pods (the controller no longer does)",
        NEEDED_BY,
        "~1-2 min cold after kube-apiserver (shared packages)",
    ),
    KWOK.install_step(
        "kwok", f"kwok {KWOK.module_version}: simulated kubelets for the test nodes", NEEDED_BY, "~2 min cold"
    ),
    InstallStep(
        name="prometheus-operator-crds",
        description="prometheus-operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), Go module",
        needed_by="tests/deploy: the chart's operator objects installed on the test API server",
        check=OPERATOR_CRDS_STEP.present,
        install=OPERATOR_CRDS_STEP.install,
        eta="~10 s (module download)",
    ),
    *DEBIAN_STEPS,
]
