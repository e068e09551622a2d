"""The ``fleetsight`` command line."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import re
import signal
import sys
import time

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleetsight import __version__, clusters, registry, stack
from fleetsight import setup as setup_mod
from fleetsight.settings import Settings

console = Console()
STATUS_STYLE = {
    "ready": "green",
    "present": "green",
    "installed": "green",
    "starting": "yellow",
    "restarting": "yellow",
    "pending": "dim",
    "stopped": "dim",
    "failed": "red",
    "skipped": "red",
    "down": "red",
    "unhealthy": "red",
}


def styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


class LazyGroup(click.Group):
    """Adds the commands that component folders declare (``CLI`` in their ``component.py``), loading
    each one's module only when it is used, so that `fleetsight --help` stays fast and a broken
    component does not break the whole CLI."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *registry.cli_entries()])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = registry.cli_entries().get(name)
        if entry is not None:
            return importlib.import_module(entry.module).cli
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] in project_packages():
                raise  # a bug of ours, not a missing extra
            entry = registry.cli_entries().get(ctx.invoked_subcommand or "")
            hints = {ctx.invoked_subcommand or "", entry.owner.removeprefix("fleetsight_") if entry else ""}
            raise click.ClickException(missing_extra(exc.name or "?", hints)) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        entries = registry.cli_entries()
        rows = []
        for name in self.list_commands(ctx):
            if name in entries:
                rows.append((name, entries[name].help))
            else:
                command = super().get_command(ctx, name)
                rows.append((name, command.get_short_help_str(70) if command else ""))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def project_packages() -> set[str]:
    """FleetSight's own import names: the core and every component folder (as installed)."""
    return {"fleetsight"} | {(m.__package__ or "") for m in registry.component_modules()}


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def missing_extra(module: str, hints: set[str] | frozenset[str] = frozenset()) -> str:
    """What to install when a command needs a module that a production install (no extras) lacks: the
    extra that declares it and is named like the command or its component (``twin`` for numpy in
    `fleetsight twin`), else every extra that declares it, else the command's own, else the list."""
    try:
        requires = importlib.metadata.requires("fleetsight") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    extras: dict[str, set[str]] = {}  # extra -> normalised distribution names
    core: set[str] = set()
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)", marker)
        name = _normal(re.split(r"[<>=!~\[ ]", requirement.strip(), maxsplit=1)[0])
        if extra:
            extras.setdefault(extra.group(1), set()).add(name)
        else:
            core.add(name)
    if not requires or _normal(module) in core:
        # a source tree run with a bare Python, or a broken install: no extra would bring it
        return (
            f"this command needs {module!r}, a dependency of FleetSight itself, which is not installed:"
            " reinstall fleetsight (pip install fleetsight), or run `make setup` in a source tree"
        )
    providing = sorted(e for e, names in extras.items() if _normal(module) in names)
    providing = sorted(set(providing) & hints) or providing or sorted(set(extras) & hints)
    if not providing:
        return f"this command needs {module!r}, which is not installed (extras: {', '.join(sorted(extras))})"
    choices = " or ".join(f"pip install 'fleetsight[{e}]'" for e in providing)
    return f"this command needs {module!r}, which is not installed: {choices}"


def stack_settings() -> Settings:
    """The stack's settings from the environment; a bad value is a usage error, not a traceback."""
    try:
        return Settings()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetsight")
def main() -> None:
    """FleetSight: observability and AIOps for GPU training clusters.

    \b
    Quick start (on a fresh machine):
      fleetsight setup      install Prometheus, Alertmanager, Thanos, Kafka, OpenSearch, rsyslog
      fleetsight up         start the whole stack on the digital twin, print its URLs
      fleetsight status     show what runs and whether it is healthy
      fleetsight down       stop everything

    Paths and ports: FLEETSIGHT_RUN_DIR (default ./run), FLEETSIGHT_CACHE_DIR (default ./.cache),
    FLEETSIGHT_PORT_BASE (default 19000; Prometheus listens on base+90). The cluster's one name:
    FLEETSIGHT_CLUSTER (default demo), on every target, alert, health record and log document.
    """


@main.command(short_help="install what the stack and the tests need, once")
@click.option("--only", multiple=True, metavar="STEP", help="Install only this step (repeatable).")
@click.option("--list", "list_only", is_flag=True, help="List the steps and whether each is installed.")
def setup(only: tuple[str, ...], list_only: bool) -> None:
    """Install everything the stack and the tests need; a second run does nothing.

    Debian packages come from apt; Thanos is built from its Go module, Kafka and OpenSearch are
    fetched from Maven Central into .cache/. The Go builds run beside the other steps (they need the
    CPUs, the others mostly the network), so steps may finish out of order. A step that fails is
    reported with the reason and its log, and the other steps still run. Exits 1 if any step failed.

    \b
    Examples:
      fleetsight setup                  install whatever is missing
      fleetsight setup --list           what is installed, what is not
      fleetsight setup --only thanos    (re)check one step
    """
    settings = stack_settings()
    steps = setup_mod.load_steps()
    if only:
        unknown = set(only) - {s.name for s in steps}
        if unknown:
            raise click.BadParameter(
                f"unknown step(s) {', '.join(sorted(unknown))}; steps: {', '.join(s.name for s in steps)}",
                param_hint="--only",
            )
        steps = [s for s in steps if s.name in only]
    if list_only:
        table = Table("step", "installed", "for", "what")
        for step in steps:
            table.add_row(
                step.name,
                styled("present" if step.check(settings) else "failed").replace("failed", "missing"),
                step.needed_by,
                step.description,
            )
        console.print(table)
        return
    started = time.monotonic()
    status_line = console.status("")
    installing: dict[str, str] = {}  # the steps installing now (two lanes at once): name -> message

    def show_installing() -> None:
        if installing:
            status_line.update("\n".join(installing.values()))
            status_line.start()
        else:
            status_line.stop()

    def on_start(step: setup_mod.InstallStep, index: int, total: int) -> None:
        eta = f" (first time: {step.eta})" if step.eta else ""
        message = f"[{index}/{total}] installing {step.name}: {step.description}{eta}"
        if console.is_terminal:
            installing[step.name] = message
            show_installing()
        else:  # a log (CI): no spinner, so say what is running before a long silence
            console.print(message + " ...")

    def on_done(result: setup_mod.StepResult, index: int, total: int) -> None:
        status_line.stop()
        installing.pop(result.step.name, None)
        name = result.step.name
        if result.outcome == "present":
            console.print(f"[{index}/{total}] {name}: {styled('present')}")
        elif result.outcome == "installed":
            console.print(f"[{index}/{total}] {name}: {styled('installed')} in {result.seconds:.0f}s")
        else:
            console.print(f"[{index}/{total}] {name}: {styled('failed')}: {result.detail}")
            console.print(f"    needed by: {result.step.needed_by}; full log: {result.log}")
            for line in setup_mod.tail(result.log).splitlines():
                console.print(f"    | {line}", markup=False, highlight=False)
        show_installing()

    # SIGTERM unwinds like Ctrl-C, so that run_logged stops the install it is running.
    signal.signal(signal.SIGTERM, interrupt)
    try:
        results = setup_mod.run_steps(settings, steps, on_start, on_done)
    except KeyboardInterrupt:
        status_line.stop()
        console.print(
            "[red]setup interrupted[/]: the step that was running was stopped; run it again to finish."
        )
        sys.exit(130)
    elapsed = time.monotonic() - started
    failed = [r for r in results if r.outcome == "failed"]
    installed = [r for r in results if r.outcome == "installed"]
    if failed:
        console.print(
            f"[red]setup: {len(failed)} step(s) failed[/] ({', '.join(r.step.name for r in failed)}); "
            "the rest is installed."
        )
        sys.exit(1)
    if not installed:
        console.print(f"setup: nothing to do, all {len(results)} steps already installed ({elapsed:.1f}s).")
    else:
        console.print(
            f"setup: installed {len(installed)} step(s) in {elapsed:.0f}s; "
            f"{len(results) - len(installed)} were already there."
        )


def interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def render_rows(rows: list[stack.Row], title: str) -> Table:
    """The state of each component; URLs are listed under the table (:func:`print_urls`), because a
    narrow terminal or a log file would otherwise cut them to "…"."""
    table = Table("component", "status", "pid", "restarts", "detail", title=title, title_justify="left")
    for row in rows:
        table.add_row(row.name, styled(row.status), str(row.pid or ""), str(row.restarts), row.detail)
    table.columns[-1].overflow = "fold"
    return table


def print_urls(rows: list[stack.Row]) -> None:
    """Every URL whole, one per line, whatever the terminal's width."""
    listed = [(row.name, key, url) for row in rows for key, url in row.urls.items()]
    if not listed:
        return
    console.print("URLs:")
    width = max(len(f"{name} {key}") for name, key, _ in listed)
    for name, key, url in listed:
        console.print(f"  {f'{name} {key}':<{width}}  {url}", soft_wrap=True, highlight=False, markup=False)


@main.command(short_help="start the stack, or the named components, and print their URLs")
@click.argument("components", nargs=-1)
@click.option(
    "--clusters",
    "cluster_count",
    type=click.IntRange(1, None),
    default=1,
    show_default=True,
    help="Twin clusters to run, each with its own stack, and above them the global layer (2: a Slurm "
    "cluster and a Kubernetes-shaped one; docs/fleet.md).",
)
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    metavar="SCENARIO",
    help="The twin's scenario (a YAML path or a shipped name: `fleetsight twin scenarios`); repeated, one "
    "cluster each, in order (the cluster is named by its scenario). Default: the demo.",
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds to wait for readiness (default 300; 600 with several clusters).",
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C stops the stack.")
def up(
    components: tuple[str, ...],
    cluster_count: int,
    scenarios: tuple[str, ...],
    timeout: float | None,
    foreground: bool,
) -> None:
    """Start the stack (or the named COMPONENTS and their dependencies) on loopback ports.

    Each component runs as a supervised process (restarted if it crashes, the restart logged);
    logs, configuration and data go under the run folder (FLEETSIGHT_RUN_DIR, default ./run).
    Returns once every component is ready, or failed, and prints where each one listens.

    With --clusters 2 (or one --scenario per cluster) each cluster runs its own whole stack (or the named
    COMPONENTS), from run/clusters/<name> on ports 1000 and 2000 above the base, and the global layer runs
    above them on the base ports: a global Thanos Query, the read API, its Prometheus and alert, one Slack
    stand-in for all clusters, and the dashboard viewer with the fleet page. About 3 GiB of memory per
    cluster.

    \b
    Examples:
      fleetsight up                          the whole stack on the twin's demo scenario
      fleetsight up prometheus               Prometheus and what it depends on
      fleetsight up --scenario mixed_day     the stack on another shipped scenario
      fleetsight up --clusters 2             two clusters (Slurm, Kubernetes) and the global layer
      FLEETSIGHT_PORT_BASE=29000 fleetsight up   a second stack beside the first
    """
    settings = stack_settings()
    several = cluster_count > 1 or len(scenarios) > 1
    wait_s = timeout if timeout is not None else (600.0 if several else 300.0)
    try:
        if several:
            titled = start_clusters(settings, list(components), cluster_count, scenarios, wait_s)
        else:
            titled = [start_one(settings, list(components), scenarios, wait_s)]
    except stack.StackError as exc:
        raise click.ClickException(str(exc)) from exc
    for title, rows in titled:
        console.print(render_rows(rows, title))
        print_urls(rows)
    bad = [r for _, rows in titled for r in rows if r.status != "ready"]
    console.print(f"logs: {settings.run_dir / 'logs'}   stop with: fleetsight down")
    if foreground:
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            stop_all(settings)
            console.print("stopped.")
    if bad:
        sys.exit(1)


def start_one(
    settings: Settings, components: list[str], scenarios: tuple[str, ...], wait_s: float
) -> tuple[str, list[stack.Row]]:
    """One cluster's stack; with a scenario, named by it unless FLEETSIGHT_CLUSTER names it."""
    if scenarios:
        try:
            facts = clusters.describe_scenario(scenarios[0])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--scenario") from None
        named = os.environ.get("FLEETSIGHT_CLUSTER") or facts["cluster"]
        settings = dataclasses.replace(
            settings, cluster=named, twin_scenario=facts["path"], scheduler=facts["scheduler"]
        )
    with Live(render_rows([], "starting..."), console=console, transient=True) as live:
        launched = stack.start(settings, components)
        rows = stack.wait([launched], wait_s, lambda r: live.update(render_rows(r[0], "starting...")))[0]
    return f"FleetSight stack (run folder {settings.run_dir})", rows


def start_clusters(
    settings: Settings, components: list[str], count: int, scenarios: tuple[str, ...], wait_s: float
) -> list[tuple[str, list[stack.Row]]]:
    """Every cluster's stack and the global layer, started together (none needs another up to start)."""
    try:
        planned = clusters.plan(settings, count, scenarios)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--clusters/--scenario") from None
    if stack.supervisor_pid(settings):
        raise stack.StackError(
            f"a stack is already running from {settings.run_dir} (see `fleetsight status`; stop it with "
            "`fleetsight down`)"
        )
    clusters.write_plan(settings, planned)
    titles = [f"global layer ({settings.run_dir})"] + [
        f"cluster {c.name} ({c.settings.run_dir}, ports from {c.settings.port_base})" for c in planned
    ]
    launched: list[stack.Launched] = []
    try:
        launched.append(stack.start(settings, clusters.global_components()))
        for cluster in planned:
            launched.append(stack.start(cluster.settings, components, cluster.env(settings)))
    except stack.StackError:
        for item in launched:
            stack.down(item.settings)
        clusters.forget_plan(settings)
        raise

    def progress(rows: list[list[stack.Row]]) -> Table:
        every = [prefixed(r, t) for t, got in zip(titles, rows, strict=True) for r in got]
        return render_rows(every, "starting...")

    with Live(render_rows([], "starting..."), console=console, transient=True) as live:
        rows = stack.wait(launched, wait_s, lambda got: live.update(progress(got)))
    return list(zip(titles, rows, strict=True))


def prefixed(row: stack.Row, title: str) -> stack.Row:
    where = title.split(" (")[0].removeprefix("cluster ")
    return dataclasses.replace(row, name=f"{where}/{row.name}")


def stack_folders(settings: Settings) -> list[tuple[str, Settings]]:
    """The stacks run from this run folder: the one stack, or the global layer and every cluster."""
    try:
        planned = clusters.read_plan(settings)
    except clusters.PlanError as exc:
        raise click.ClickException(str(exc)) from None
    if not planned:
        return [("FleetSight stack", settings)]
    return [("global layer", settings)] + [(f"cluster {c.name}", c.settings) for c in planned]


@main.command(short_help="show what runs and whether it is healthy")
def status() -> None:
    """Show each component of the running stack and whether it is healthy (exits 1 if not).

    Each component that was ready is checked again now (is its process alive, does its readiness
    check still pass?), so a crash or a hang shows here even between restarts. After `up --clusters N`,
    the global layer and every cluster, one table each.

    \b
    Examples:
      fleetsight status
      FLEETSIGHT_RUN_DIR=/tmp/stack2 fleetsight status    a second stack's state
    """
    settings = stack_settings()
    healthy = True
    shown = 0
    for title, folder in stack_folders(settings):
        running, rows = stack.status(folder)
        if not rows:
            continue
        shown += 1
        state = "running" if running else "supervisor NOT running"
        console.print(render_rows(rows, f"{title}: {state} ({folder.run_dir})"))
        print_urls(rows)
        healthy = healthy and running and all(r.status in ("ready", "skipped") for r in rows)
    if not shown:
        console.print(f"no stack has run from {settings.run_dir}; start one with `fleetsight up`")
        sys.exit(1)
    if not healthy:
        sys.exit(1)


def stop_all(settings: Settings, timeout: float | None = None) -> bool:
    """Stop every stack run from this run folder; False when nothing was running."""
    stopped = False
    for _, folder in stack_folders(settings):
        if stack.supervisor_pid(folder) is None and not stack.rows_from_state(folder):
            continue
        stopped = True
        for note in stack.down(folder, timeout):
            console.print(f"[yellow]{note}[/]")
    clusters.forget_plan(settings)
    return stopped


@main.command(short_help="stop every component of the stack")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Seconds before a hung supervisor is killed (default: the components' stop timeouts + 15 s).",
)
def down(timeout: float | None) -> None:
    """Stop every component of the stack cleanly, leaving no process behind (after `up --clusters N`,
    every cluster's stack and the global layer).

    Each component gets SIGTERM (its whole process group), then SIGKILL after its stop timeout (10 s;
    30 s for the node rsyslog, which may be handing records to Kafka); if the supervisor itself was
    killed, the components it had started are found from the run folder's state.

    \b
    Examples:
      fleetsight down
      fleetsight down --timeout 10     give up on a hung supervisor sooner
    """
    settings = stack_settings()
    if not stop_all(settings, timeout):
        console.print("nothing is running.")
        return
    console.print("stack stopped.")


if __name__ == "__main__":
    main()
