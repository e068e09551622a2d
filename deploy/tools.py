"""The Kubernetes tools that ``fleetsight setup`` builds from Go modules for the chart's tests: helm,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok (simulated kubelets).

helm and kwok build like Thanos (:class:`fleetsight.gobuild.GoModuleBuild`); they only stamp their version
elsewhere and report it with another command. ``go install k8s.io/kubernetes/cmd/...@v1.31.4`` is refused
(k8s.io/kubernetes maps its staging modules to ./staging with replace directives), so the Kubernetes
binaries build inside a small wrapper module (:class:`KubeBuild`): it requires k8s.io/kubernetes and maps
each staging module named by that module's own go.mod to the published ``v0.<minor>.<patch>`` release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetsight.gobuild import GoModuleBuild
from fleetsight.settings import Settings
from fleetsight.setup import InstallError, go_env, run_logged

VERSION_TIMEOUT_S = 10


def reported_version(command: list[str | os.PathLike]) -> str:
    """What the binary prints for its version command, or "" when it does not run."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (result.stdout + result.stderr).strip() if result.returncode == 0 else ""


@dataclass(frozen=True)
class ToolBuild(GoModuleBuild):
    """A Go module build whose version is stamped with the given ``-X`` flags and read back with
    ``version_args`` (helm has no ``--version``)."""

    version_vars: tuple[str, ...] = ()  # package.variable=value
    version_args: tuple[str, ...] = ("--version",)

    def ldflags(self) -> str:
        return " ".join(f"-X {item}" for item in self.version_vars)

    def reported_version(self, settings: Settings) -> str:
        return reported_version([self.binary(settings), *self.version_args])

    def reports_release(self, settings: Settings) -> bool:
        return self.release in self.reported_version(settings)


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


@dataclass(frozen=True)
class KubeBuild(ToolBuild):
    """A binary of k8s.io/kubernetes (package: its import path) built in the wrapper module."""

    def prepare(self, scratch: Path, log: Path) -> Path:
        source = self.download_source(log)
        tree = scratch / "wrapper"
        tree.mkdir()
        (tree / "go.mod").write_text(wrapper_go_mod((source / "go.mod").read_text(), self.module_version))
        # a build-tagged import so that `go mod tidy` resolves the package's whole dependency graph
        (tree / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{self.package}"\n')
        run_logged(["go", "mod", "tidy"], log, cwd=tree, env=go_env())
        return tree


KUBERNETES_VERSION = "v1.31.4"
HELM_VERSION = "v3.16.3"
KWOK_VERSION = "v0.7.0"
KUBE_VERSION_VARS = (
    f"k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
    "k8s.io/component-base/version.gitMajor=1",
    f"k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
    "k8s.io/component-base/version.gitTreeState=clean",
)


def kube_build(name: str) -> KubeBuild:
    return KubeBuild(
        binary_name=name,
        module="k8s.io/kubernetes",
        module_version=KUBERNETES_VERSION,
        package=f"k8s.io/kubernetes/cmd/{name}",
        tags="",
        release=KUBERNETES_VERSION,
        branch="",
        stamp_detail="wrapper-module",
        version_vars=KUBE_VERSION_VARS,
    )


HELM = ToolBuild(
    binary_name="helm",
    module="helm.sh/helm/v3",
    module_version=HELM_VERSION,
    package="./cmd/helm",
    tags="",
    release=HELM_VERSION,
    branch="",
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
KWOK = ToolBuild(
    binary_name="kwok",
    module="sigs.k8s.io/kwok",
    module_version=KWOK_VERSION,
    package="./cmd/kwok",
    tags="",
    release=KWOK_VERSION.removeprefix("v"),
    branch="",
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
        if shutil.which("go") is None:
            raise InstallError("the Go toolchain is not on PATH: it downloads prometheus-operator's module")
        build = GoModuleBuild(
            binary_name="",
            module=self.module,
            module_version=self.version,
            package="",
            tags="",
            release="",
            branch="",
        )
        source = build.download_source(log) / "example" / "prometheus-operator-crd"
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
