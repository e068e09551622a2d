"""The Kubernetes tools that ``fleetsight setup`` builds from Go modules for the chart's tests: helm,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok (simulated kubelets). Each is a
configuration of :class:`fleetsight.gobuild.GoModuleBuild`: its own version variables and version command,
and the bare release in the version output.

``go install k8s.io/kubernetes/cmd/...@v1.31.4`` is refused (k8s.io/kubernetes maps its staging modules to
./staging with replace directives), so the Kubernetes binaries build inside the builder's wrapper module:
:func:`wrapper_go_mod` requires k8s.io/kubernetes and maps each staging module named by that module's own
go.mod to the published ``v0.<minor>.<patch>`` release.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from fleetsight.gobuild import GoModuleBuild, WrapperGoMod, download_module, require_go
from fleetsight.settings import Settings
from fleetsight.setup import InstallError

STAGING = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/", re.MULTILINE)


def wrapper_go_mod(kubernetes_go_mod: str, version: str) -> str:
    """go.mod of the wrapper module: k8s.io/kubernetes at version, each staging module at v0.<minor>."""
    staging = version.replace("v1.", "v0.", 1)
    modules = sorted(set(STAGING.findall(kubernetes_go_mod)))
    if not modules:
        raise InstallError("k8s.io/kubernetes's go.mod names no staging module: cannot map them")
    go = re.search(r"^go\s+(\S+)", kubernetes_go_mod, re.MULTILINE)
    replaces = "".join(f"\t{m} => {m} {staging}\n" for m in modules)
    return (
        "module fleetsight.local/kubebuild\n\n"
        f"go {go.group(1) if go else '1.22.0'}\n\n"
        f"require k8s.io/kubernetes {version}\n\n"
        f"replace (\n{replaces})\n"
    )


def tool_build(
    name: str,
    module: str,
    version: str,
    package: str,
    *,
    release: str | None = None,
    stamp_detail: str = "",
    version_vars: tuple[str, ...] = (),
    version_args: tuple[str, ...] = ("--version",),
    wrapper: WrapperGoMod | None = None,
) -> GoModuleBuild:
    """A tool that stamps its version with its own variables (none: as the module sets it) and prints
    the bare release (default: the module version), not Prometheus's "version X" line."""
    return GoModuleBuild(
        binary_name=name,
        module=module,
        module_version=version,
        package=package,
        tags="",
        release=version if release is None else release,
        stamp_detail=stamp_detail,
        version_vars=version_vars,
        version_args=version_args,
        version_marker="{release}",
        wrapper_go_mod=wrapper,
    )


KUBERNETES_VERSION = "v1.31.4"
HELM_VERSION = "v3.16.3"
KWOK_VERSION = "v0.7.0"
KUBE_VERSION_VARS = (
    f"k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
    "k8s.io/component-base/version.gitMajor=1",
    f"k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
    "k8s.io/component-base/version.gitTreeState=clean",
)


def kube_build(name: str) -> GoModuleBuild:
    """A binary of k8s.io/kubernetes (package: its import path) built in the wrapper module."""
    return tool_build(
        name,
        "k8s.io/kubernetes",
        KUBERNETES_VERSION,
        f"k8s.io/kubernetes/cmd/{name}",
        stamp_detail="wrapper-module",
        version_vars=KUBE_VERSION_VARS,
        wrapper=wrapper_go_mod,
    )


HELM = tool_build(
    "helm",
    "helm.sh/helm/v3",
    HELM_VERSION,
    "./cmd/helm",
    stamp_detail="k8s-1.31",  # the Kubernetes version helm assumes offline (template, lint)
    version_vars=(
        f"helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        # as helm's Makefile does from its client-go (v0.31): without them helm assumes Kubernetes 1.20
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=31",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=31",
    ),
    version_args=("version", "--short"),
)
KWOK = tool_build(
    "kwok", "sigs.k8s.io/kwok", KWOK_VERSION, "./cmd/kwok", release=KWOK_VERSION.removeprefix("v")
)
KUBE_APISERVER = kube_build("kube-apiserver")
KUBE_CONTROLLER_MANAGER = kube_build("kube-controller-manager")
KUBE_SCHEDULER = kube_build("kube-scheduler")


PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
OPERATOR_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


@dataclass(frozen=True)
class OperatorCrds:
    """prometheus-operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule), taken from its Go module's
    example/prometheus-operator-crd folder: the test API server learns them, and validates the chart's
    operator objects against their OpenAPI schemas as a real cluster would."""

    module: str = "github.com/prometheus-operator/prometheus-operator"
    version: str = PROMETHEUS_OPERATOR_VERSION

    def folder(self, settings: Settings) -> Path:
        return settings.cache_dir / "crds" / f"prometheus-operator-{self.version}"

    def files(self, settings: Settings) -> list[Path]:
        return [self.folder(settings) / f"monitoring.coreos.com_{name}.yaml" for name in OPERATOR_CRDS]

    def present(self, settings: Settings) -> bool:
        return all(path.is_file() for path in self.files(settings))

    def install(self, settings: Settings, log: Path) -> None:
        require_go("download prometheus-operator's module")
        source = download_module(self.module, self.version, log) / "example" / "prometheus-operator-crd"
        target = self.folder(settings)
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for path in self.files(settings):
            if not (source / path.name).is_file():
                raise InstallError(f"{self.module}@{self.version} has no {path.name} under {source}")
            shutil.copyfile(source / path.name, partial / path.name)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)


OPERATOR_CRDS_STEP = OperatorCrds()
