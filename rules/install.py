"""``fleetsight setup`` step for promtool 3.x, built from the Prometheus Go module.

Production runs the official Prometheus 3.x images while Debian ships 2.42, so the rules are checked and
unit-tested with both. No binary can be downloaded here: like Thanos, it is built from its module by
:mod:`fleetsight.gobuild`. The Go module version v0.3NN.x is Prometheus v3.NN.x.
"""

from __future__ import annotations

from fleetsight.gobuild import GoModuleBuild

PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_MODULE_VERSION = "v0.316.0"


def prometheus_release(module_version: str = PROMETHEUS_MODULE_VERSION) -> str:
    """The release a module version stands for: v0.316.0 -> 3.16.0."""
    major_minor, patch = module_version.removeprefix("v0.").split(".", 1)
    return f"{int(major_minor) // 100}.{int(major_minor) % 100}.{patch}"


PROMTOOL3_BUILD = GoModuleBuild(
    binary_name="promtool3",
    module=PROMETHEUS_MODULE,
    module_version=PROMETHEUS_MODULE_VERSION,
    package="./cmd/promtool",
    # promtool needs no service discovery; leaving the SD plugins out also avoids modules that the
    # proxy refuses (nomad's pseudo-version answers 403).
    tags="netgo,remove_all_sd",
    release=prometheus_release(),
    branch=f"release-{prometheus_release()}",
    stamp_detail="cmd/promtool",
)


INSTALL_STEPS = [
    PROMTOOL3_BUILD.install_step(
        "promtool3",
        f"promtool {prometheus_release()} (Prometheus 3.x rule checks), built from its Go module",
        "tests/rules (rules checked and unit-tested with promtool 2.x and 3.x)",
        "~3-6 min cold (Go build, 2 cores), ~30 s with warm Go caches",
    ),
]
