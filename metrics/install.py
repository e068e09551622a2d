"""``fleetsight setup`` steps of the metrics component: Debian's Prometheus (with promtool) and
node_exporter, and Thanos, built from its Go module since no binary download is possible.

``go install module@version`` is refused (Thanos's go.mod has replace directives): the build goes through
:mod:`fleetsight.gobuild`. The ``slicelabels`` build tag is not optional: without it the sidecar panics
on its first gRPC call.

Go's module and build caches stay in their default places (~/go, ~/.cache/go-build; ~10 GB after a
build) so that a rebuild after a version bump only compiles what changed.
"""

from __future__ import annotations

from fleetsight.gobuild import GoModuleBuild
from fleetsight.setup import apt_step

THANOS_MODULE = "github.com/thanos-io/thanos"
THANOS_VERSION = "v0.42.4"  # as in shared/STACK.md; its go.mod asks for Go 1.26
THANOS_BUILD = GoModuleBuild(
    binary_name="thanos",
    module=THANOS_MODULE,
    module_version=THANOS_VERSION,
    package="./cmd/thanos",
    tags="netgo,slicelabels",
    release=THANOS_VERSION.removeprefix("v"),
    branch=f"release-{THANOS_VERSION}",
)


INSTALL_STEPS = [
    apt_step(
        "prometheus",
        "Debian's Prometheus (prometheus, promtool 2.x) and node_exporter",
        "prometheus A/B, node-exporter; promtool for config checks, rules tests, the evaluation's backfill",
        {"prometheus": "prometheus", "prometheus-node-exporter": "prometheus-node-exporter"},
    ),
    THANOS_BUILD.install_step(
        "thanos",
        f"Thanos {THANOS_VERSION} (sidecar, store, query, compact), built from its Go module",
        "thanos sidecar/store/query/compact",
        "~4-8 min cold (Go build, 2 cores), ~1 min with warm Go caches",
    ),
]
