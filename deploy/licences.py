"""``fleetsight licences``: the licence of every artifact that ``fleetsight setup`` and the Python packages
bring in, as each artifact's own metadata declares it, checked against the policy in deploy/licences.yml.

What is listed comes from the install steps themselves (:func:`fleetsight.setup.load_steps`), not from
scanning caches: a stale leftover in the Go module cache or ~/.m2 (an old Grafana build) is not something
setup brings in. Per step:

- apt steps: each named Debian package, licence from /usr/share/doc/PKG/copyright (``License:`` fields);
- Go builds (:class:`fleetsight.gobuild.GoModuleBuild`): the built binary's main module and every
  dependency (``go version -m``), licence classified from the module's LICENSE/COPYING in GOMODCACHE;
- the other steps as licences.yml maps them: a private venv (Python metadata), Maven folders (each jar's
  pom ``<licenses>``, embedded or in ~/.m2), an npm tree (package.json ``license``), a model's NOTICE.

Plus the project's own .venv (every installed distribution; uv.lock entries that are not installed are
listed as such). Every root is configurable (:class:`Roots`), so tests feed it fake artifacts as files.

This module turns the install steps into what to read and holds the command; reading each kind is
licences_collect's (licences_maven's for Maven), classifying and judging licences_classify's, and the
output licences_render's.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from .licences_classify import POLICY_FILE, Artifact, Policy, Row, failing, judge_all, load_policy
from .licences_collect import (
    Roots,
    debian_artifact,
    go_artifacts,
    go_module_artifact,
    gomodcache,
    lock_only,
    model_artifacts,
    npm_artifacts,
    python_artifacts,
)
from .licences_maven import MavenRepo, distribution_artifact, maven_artifacts
from .licences_render import DOC_FILE, failure_message, markdown, operator_images, summary, text_table

# -- from the install steps -------------------------------------------------------------------------


@dataclass
class StepPlan:
    """What the install steps bring in, sorted by how it is read."""

    go_binaries: dict[Path, tuple[str, str, str]] = field(default_factory=dict)
    go_sources: list[tuple[str, str, str]] = field(default_factory=list)
    debian: dict[str, str] = field(default_factory=dict)
    mapped: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)


def plan_steps(steps: Iterable[Any], policy: Policy, cache_dir: Path) -> StepPlan:
    from fleetsight.gobuild import GoModuleBuild

    plan = StepPlan()
    for step in steps:
        owner = getattr(step.check, "__self__", None)
        packages = (
            inspect.getclosurevars(step.check).nonlocals.get("packages")
            if inspect.isfunction(step.check)
            else None
        )
        if isinstance(owner, GoModuleBuild):
            binary = cache_dir / "bin" / owner.binary_name
            plan.go_binaries[binary] = (step.name, owner.module, owner.module_version)
        elif isinstance(packages, dict):  # an apt_step: its package names
            plan.debian.update({p: step.name for p in packages})
        elif step.name in policy.steps:
            spec = policy.steps[step.name]
            if spec.get("go_source") and owner is not None:
                plan.go_sources.append((owner.module, owner.version, step.name))
            else:
                plan.mapped.append((step.name, spec))
        else:
            plan.unmapped.append(step.name)
    return plan


def mapped_artifacts(name: str, spec: dict[str, Any], roots: Roots, repo: MavenRepo) -> list[Artifact]:
    found: list[Artifact] = []
    if "python_venv" in spec:
        venv = roots.cache_dir / spec["python_venv"]
        found += python_artifacts(venv, f"python:{spec['python_venv']}", name) or [missing(name, venv)]
    distribution = None
    if "distribution" in spec:
        distribution = distribution_artifact(spec["distribution"], roots.cache_dir, repo, name)
        found.append(distribution)
    if "maven" in spec:
        folders = [roots.cache_dir / f for f in spec["maven"]]
        jars = maven_artifacts([f for f in folders if f.is_dir()], repo, name)
        found += [bundled(jar, distribution) for jar in jars]
        found += [missing(name, f) for f in folders if not f.is_dir()]
    if "npm" in spec:
        folder = roots.cache_dir / spec["npm"]
        found += npm_artifacts(folder, name) if folder.is_dir() else [missing(name, folder)]
    if "model" in spec:
        found += model_artifacts(roots.venv, spec["model"], name) or [missing(name, Path(spec["model"]))]
    return found


def bundled(jar: Artifact, distribution: Artifact | None) -> Artifact:
    """A jar that declares no licence of its own and came inside a distribution zip (no pom of it was
    fetched): the licence the distribution declares for what it ships, said so in the source column."""
    if jar.licence or distribution is None or not distribution.licence:
        return jar
    source = f"bundled in {distribution.name} (its declared licence)"
    return replace(jar, licence=distribution.licence, source=source, note="")


def missing(step: str, path: Path) -> Artifact:
    return Artifact("step", step, "", "", str(path), step, f"{path} not found: run `fleetsight setup`")


def inventory(roots: Roots, steps: Iterable[Any], policy: Policy) -> list[Artifact]:
    plan = plan_steps(steps, policy, roots.cache_dir)
    repo = MavenRepo(roots.m2)
    cache_root = gomodcache(roots)
    artifacts = python_artifacts(roots.venv, "python", "the project's .venv (uv.lock)")
    artifacts += lock_only(roots.repo, artifacts)
    artifacts += go_artifacts(plan.go_binaries, cache_root)
    artifacts += [go_module_artifact(cache_root, m, v, step) for m, v, step in plan.go_sources]
    artifacts += [debian_artifact(p, roots.debian_doc, step) for p, step in sorted(plan.debian.items())]
    for name, spec in plan.mapped:
        artifacts += mapped_artifacts(name, spec, roots, repo)
    note = "install step not inventoried: map it in deploy/licences.yml"
    artifacts += [Artifact("step", s, "", "", "", s, note) for s in plan.unmapped]
    return artifacts


def run_inventory(roots: Roots | None = None, policy_file: Path = POLICY_FILE) -> list[Row]:
    from fleetsight.setup import load_steps

    policy = load_policy(policy_file)
    return judge_all(inventory(roots or Roots(), load_steps(), policy), policy)


@click.command()
@click.option("--format", "output", type=click.Choice(["table", "markdown"]), default="table",
              help="table: print; markdown: write docs/licences.md (or --out).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print every row as JSON (for machines).")
@click.option("--out", type=click.Path(path_type=Path), default=DOC_FILE, help="Where markdown goes.")
@click.option("--venv", type=click.Path(path_type=Path), default=Roots.venv, help="The project's venv.")
@click.option("--gomodcache", type=click.Path(path_type=Path), default=None, help="Go's module cache.")
@click.option("--m2", type=click.Path(path_type=Path), default=Roots.m2, help="Maven's local repository.")
def cli(output: str, as_json: bool, out: Path, venv: Path, gomodcache: Path | None, m2: Path) -> None:
    """The licence of every artifact that setup and the packages bring in; exit 1 on any denied or
    unknown licence that no reviewed exception covers.

    \b
    Examples:
      fleetsight licences                      table and summary
      fleetsight licences --format markdown    regenerate docs/licences.md
      fleetsight licences --json               one JSON object per artifact
    """
    roots = Roots(venv=venv, gomodcache=gomodcache, m2=m2)
    rows = run_inventory(roots)
    if as_json:
        click.echo(
            json.dumps(
                [{**asdict(r.artifact), "verdict": r.verdict, "reason": r.reason} for r in rows], indent=1
            )
        )
    elif output == "markdown":
        out.write_text(markdown(rows, operator_images(roots.repo, load_policy())))
        click.echo(f"licences: wrote {out}", err=True)
    else:
        click.echo(text_table(rows))
        click.echo(summary(rows))
    if failing(rows):
        click.echo(failure_message(rows), err=True)
        sys.exit(1)
