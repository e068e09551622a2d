"""`fleetsight checks ...`: the catalogue, running one check here, the results service, and one
scheduling pass on Slurm or Kubernetes."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx
import yaml

from fleetsight.logs import setup_logging
from fleetsight.secrets import SecretFileError, read_secret_file
from fleetsight.webconfig import listen_address, run_server, uvicorn_tls, web_config_option

from . import runner
from .catalog import CATALOG_FILE, CatalogError, catalog_table, load_catalog
from .plan import Unit, load_leaf_map
from .scan_cli import scan_plan_command, scans_option

# `run` and `pair` run on GPU nodes, whose small runtime has no fastapi/uvicorn (deploy/debian/build.py
# NODE): the service's modules are imported by `serve` alone.
POLICY_FILE = CATALOG_FILE.with_name("policy.yml")
LIGHT_ENV = "FLEETSIGHT_CHECKS_URL"
log = logging.getLogger("fleetsight.checks")


class ReportFailed(click.ClickException):
    """The checks service could not take the results: exit 3, told apart from a failed check (1)."""

    exit_code = 3


CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(name="checks", context_settings=CONTEXT)
def cli() -> None:
    """Active health checks: light ones on every node, intrusive ones on idle nodes.

    \b
    Examples:
      fleetsight checks catalog
      fleetsight checks run --node n0001 --check row_remap --check power_brake
      fleetsight checks serve --state-dir /var/lib/fleetsight/checks
      fleetsight checks scan-plan --checks-url http://checks:9443 --overdue
    """


def _catalog(path: Path):  # type: ignore[no-untyped-def]
    try:
        return load_catalog(path)
    except (CatalogError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


@cli.command("catalog")
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
def catalog_command(catalog_file: Path) -> None:
    """Print every check with its kind, cost, what it disturbs and what it needs.

    \b
    Examples:
      fleetsight checks catalog
    """
    click.echo(catalog_table(_catalog(catalog_file)))


@cli.command("run")
@click.option("--node", required=True, help="This node's name (as the scheduler knows it).")
@click.option("--check", "names", multiple=True, help="A check to run (repeat); default: every light one.")
@click.option("--tools", type=click.Path(path_type=Path), default=runner.TOOLS_FILE, show_default=True)
@click.option("--report", default=None, envvar=LIGHT_ENV, help="The checks service: post results there.")
@click.option(
    "--every",
    type=float,
    default=None,
    help="Run again every SECONDS, for ever (a container's own timer; systemd nodes use a timer unit).",
)
@click.option(
    "--tool-output",
    type=click.Path(path_type=Path),
    default=None,
    help="Judge what the tool already printed: DIR/stdout and its exit status DIR/rc (a Kubernetes Job "
    "whose tool ran in its own image, e.g. NVIDIA's DCGM image), instead of running it here.",
)
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
def run_command(
    node: str,
    names: tuple[str, ...],
    tools: Path,
    report: str | None,
    every: float | None,
    tool_output: Path | None,
    catalog_file: Path,
) -> None:
    """Run checks on this node and print one JSON result per line.

    Each result has an outcome: passed, failed, or unknown (the check could not observe: tool missing,
    timeout, exporter unreachable, TLS or credentials wrong, fields not published; `reason` says which).
    An unknown never counts against the node. Exit 0 if every check passed, 1 if a check failed, 4 if
    none failed but one was unknown, 3 if the results could not be posted (they are still printed). The
    post carries the bearer token (scope `results`) of FLEETSIGHT_CHECKS_TOKEN or of the file
    FLEETSIGHT_CHECKS_TOKEN_FILE names.

    \b
    Examples:
      fleetsight checks run --node n0001                      # every light check, once
      fleetsight checks run --node n0001 --check dcgm_diag_r3 --report http://checks:9443
      fleetsight checks run --node n0001 --every 900          # a loop (the DaemonSet)
    """
    catalog = _catalog(catalog_file)
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise click.ClickException(f"unknown check {unknown[0]!r}; checks are {', '.join(sorted(catalog))}")
    chosen = [catalog[n] for n in names] or [c for c in catalog.values() if not c.intrusive]
    loaded = _tools(tools)
    if tool_output is not None:
        if len(chosen) != 1 or every is not None:
            raise click.UsageError("--tool-output judges one check (--check NAME), once")
        result = runner.judge_output(chosen[0], node, tool_output)
        click.echo(runner.dumps([result]))
        _report(report, [result])
        sys.exit(runner.exit_code([result]))
    if every is None:
        sys.exit(_run_once(chosen, node, loaded, report))
    setup_logging()
    while True:  # a DaemonSet's loop: a failed pass is logged and the next one comes all the same
        started = time.monotonic()
        try:
            code = _run_once(chosen, node, loaded, report)
            log.info("event=light_checks_done node=%s exit=%d", node, code)
        except click.ClickException as exc:
            log.warning("event=light_checks_not_reported node=%s error=%s", node, exc.message)
        time.sleep(max(0.0, every - (time.monotonic() - started)))


def _tools(path: Path) -> runner.Tools:
    try:
        return runner.load_tools(path)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _run_once(chosen: list[Any], node: str, tools: runner.Tools, report: str | None) -> int:
    results = [runner.run_check(check, node, tools) for check in chosen]
    click.echo(runner.dumps(results))
    _report(report, results)
    return runner.exit_code(results)


def _report(report: str | None, results: list[dict[str, Any]]) -> None:
    if not report:
        return
    try:
        token = runner.client_token()
    except ValueError as exc:
        raise ReportFailed(f"cannot post the results to {report}: {exc}") from None
    try:
        runner.post_results(report, results, token)
    except httpx.HTTPError as exc:
        raise ReportFailed(f"cannot post the results to {report}: {exc}") from exc


@cli.command("pair")
@click.option("--check", "name", default="ib_pair_bandwidth", show_default=True)
@click.option("--client", required=True, help="The node that runs the clients and records the result.")
@click.option("--server", required=True, help="The node that runs the servers.")
@click.option("--server-address", default=None, help="How the client reaches the server (default its name).")
@click.option(
    "--here",
    required=True,
    envvar="SLURMD_NODENAME",
    help="This node: the side it plays follows (default: Slurm's SLURMD_NODENAME in a job step).",
)
@click.option("--tools", type=click.Path(path_type=Path), default=runner.TOOLS_FILE, show_default=True)
@click.option("--report", default=None, envvar=LIGHT_ENV, help="The checks service's URL.")
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
def pair_command(**options: Any) -> None:
    """One side of a pair check (both sides start at once: a two-node Slurm job step, two pinned Jobs).
    The client side prints and posts one result per node of the pair, each with a result per port.

    \b
    Examples:
      fleetsight checks pair --client n0001 --server n0002 --report http://checks:9443
    """
    catalog = _catalog(options["catalog_file"])
    check = catalog.get(options["name"])
    if check is None or check.nodes != 2:
        raise click.ClickException(f"{options['name']!r} is not a pair check of the catalogue")
    tools, here = _tools(options["tools"]), options["here"]
    client, server = options["client"], options["server"]
    if here == server:
        for output in runner.run_pair_server(check, server, client, tools):
            click.echo(output.rstrip())
        return
    if here != client:
        raise click.ClickException(f"this node ({here}) is neither {client} nor {server}")
    results = runner.run_pair_client(check, client, server, tools, options["server_address"])
    click.echo(runner.dumps(results))
    _report(options["report"], results)
    sys.exit(runner.exit_code(results))


@cli.command("serve")
@click.option("--listen", default="127.0.0.1:9443", show_default=True)
@click.option("--state-dir", type=click.Path(path_type=Path), required=True)
@click.option(
    "--cluster",
    envvar="FLEETSIGHT_CLUSTER",
    default="default",
    show_default=True,
    help="The cluster's name (as Prometheus's external label `cluster`), on every result metric.",
)
@click.option("--policy", "policy_file", type=click.Path(path_type=Path), default=POLICY_FILE)
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
@click.option(
    "--open-reads/--token-reads",
    default=True,
    show_default=True,
    help="Answer reads (results, policy, catalogue, /metrics) without a token (cluster network), or only "
    "to a token with scope `read`.",
)
@click.option(
    "--results-token-file",
    envvar="FLEETSIGHT_CHECKS_RESULTS_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file holding one bearer token with scope `results` (POST /v1/results): the same file (or "
    "Secret) the posting side reads through FLEETSIGHT_CHECKS_TOKEN_FILE.",
)
@click.option(
    "--open-writes",
    is_flag=True,
    default=False,
    help="Take POST /v1/results from anyone, without a token: anyone who reaches the port can then put a "
    "drained node back in service with a forged PASS. Only for a test bench.",
)
@web_config_option
def serve_command(
    listen: str,
    state_dir: Path,
    cluster: str,
    policy_file: Path,
    catalog_file: Path,
    open_reads: bool,
    results_token_file: Path | None,
    open_writes: bool,
    web_config_file: str | None = None,
) -> None:
    """Keep the latest result per node and check; serve /v1/results, /v1/policy and /metrics.

    A post of results needs a bearer token with scope `results` (a PASS resumes a drained node through
    the health service's validation gate): FLEETSIGHT_CHECKS_TOKENS="tok=results;other=read" or a file
    named by FLEETSIGHT_CHECKS_TOKENS_FILE (one "token scope,scope" per line), or a bare token in the
    --results-token-file (the posting side's own file or Secret). The service refuses to
    start without one, unless --open-writes says so explicitly. The posting side (checks run/pair)
    sends FLEETSIGHT_CHECKS_TOKEN or the token in the file FLEETSIGHT_CHECKS_TOKEN_FILE names.

    \b
    Examples:
      FLEETSIGHT_CHECKS_TOKENS_FILE=/etc/fleetsight/checks-tokens \\
          fleetsight checks serve --listen 0.0.0.0:9443 --state-dir /var/lib/fleetsight/checks
      fleetsight checks serve --listen 0.0.0.0:9443 --state-dir /var/lib/fleetsight/checks \\
          --web.config.file /etc/fleetsight/web-config.yml    # TLS, as the other services
    """
    from fleetsight import auth

    from .service import RESULTS, SCOPES, TOKENS_PREFIX, ResultStore, create_app, load_policy, validate_policy

    setup_logging()
    try:
        tokens = auth.load_tokens(TOKENS_PREFIX, SCOPES)
    except auth.TokenError as exc:
        raise click.ClickException(str(exc)) from None
    if results_token_file is not None:
        try:
            token = read_secret_file(results_token_file, "--results-token-file")
        except SecretFileError as exc:
            raise click.ClickException(str(exc)) from None
        tokens[token] = tokens.get(token, frozenset()) | {RESULTS}
    if open_writes:
        log.warning(
            "event=open_writes: POST /v1/results takes results from anyone without a token; anyone who "
            "reaches the port can resume a drained node with a forged PASS"
        )
    elif not any(RESULTS in scopes for scopes in tokens.values()):
        raise click.UsageError(
            "no token with scope `results` is configured, so nothing could post results: set "
            f"{TOKENS_PREFIX}_TOKENS='token=results', {TOKENS_PREFIX}_TOKENS_FILE (one 'token results' "
            "per line) or --results-token-file, or pass --open-writes to take results from anyone (a test "
            "bench only)"
        )
    if not open_reads and not any(auth.READ in scopes for scopes in tokens.values()):
        raise click.UsageError(
            f"--token-reads needs at least one token with scope `read` ({TOKENS_PREFIX}_TOKENS)"
        )
    guard = auth.TokenGuard(tokens, open_reads, frozenset({RESULTS}) if open_writes else frozenset())
    catalog = _catalog(catalog_file)
    try:
        policy = load_policy(policy_file)
        validate_policy(policy, catalog)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    host, port = listen_address(listen)  # a bad address or file stops here, before anything is written
    tls = uvicorn_tls(web_config_file)
    state_dir.mkdir(parents=True, exist_ok=True)
    store = ResultStore(catalog, state_dir / "results.json")
    run_server(create_app(store, policy, cluster, guard), host, port, tls)


@cli.command("slurm-cycle")
@click.option("--checks-url", required=True, help="The checks service (jobs post their results there).")
@click.option("--health-url", default=None, help="The health service: validation requests come from it.")
@click.option(
    "--retry-after", default=3600.0, show_default=True, help="Seconds before a failed validation reruns."
)
@click.option("--periodic", multiple=True, help="An intrusive check to run on idle nodes (repeat).")
@click.option(
    "--every", default=7 * 86400.0, show_default=True, help="Seconds between periodic runs of a node."
)
@click.option("--leaf-map", type=click.Path(path_type=Path), default=None, help="YAML node -> leaf(s).")
@click.option("--budget", default=2, show_default=True, help="Nodes of the cluster under test at most.")
@click.option("--tools", type=click.Path(path_type=Path), default=runner.TOOLS_FILE, show_default=True)
@click.option("--output-dir", type=click.Path(path_type=Path), required=True, help="The jobs' output files.")
@scans_option
@click.option(
    "--job-token-file",
    default=None,
    help="A file on the nodes holding the jobs' token (scope `results`): the jobs get its path as "
    "FLEETSIGHT_CHECKS_TOKEN_FILE. Default: the cycle's own FLEETSIGHT_CHECKS_TOKEN[_FILE] goes with "
    "the job's environment (--export=ALL).",
)
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
def slurm_cycle_command(**options) -> None:  # type: ignore[no-untyped-def]
    """One pass: start the intrusive checks the plan allows now as Slurm jobs, print what waits and why.

    \b
    Examples:
      fleetsight checks slurm-cycle --checks-url http://127.0.0.1:9443 --health-url http://127.0.0.1:9441
    """
    from .scan_cycle import plan_scans, post_reports
    from .slurm import SlurmChecks, validation_requests

    catalog = _catalog(options["catalog_file"])
    slurm = SlurmChecks(
        catalog,
        options["checks_url"],
        [sys.executable, "-m", "fleetsight.cli"],
        options["tools"],
        options["output_dir"],
        leaf_map=load_leaf_map(options["leaf_map"]) if options["leaf_map"] else None,
        budget=options["budget"],
        token_file=options["job_token_file"],
    )
    health = options["health_url"]
    wanted = validation_requests(health, catalog, options["retry_after"]) if health else []
    wanted += periodic_units(options["checks_url"], options["periodic"], options["every"], slurm.nodes())
    scans = plan_scans(
        options["scans"], options["checks_url"], slurm.nodes(), [u for _, u, _ in slurm.running()]
    )
    slurm.caps = scans.caps
    decision = slurm.cycle(wanted + scans.units)
    reports = post_reports(options["checks_url"], scans, decision)
    results = _results(options["checks_url"])
    slurm.publish_comments(results)
    click.echo(
        json.dumps(
            {
                "started": [{"check": u.check, "nodes": list(u.nodes)} for u in decision.start],
                "waiting": [
                    {"check": u.check, "nodes": list(u.nodes), "why": w} for u, w in decision.waiting.items()
                ],
                "scans": reports,
            }
        )
    )


def _results(checks_url: str) -> list[dict[str, Any]]:
    """The service's latest results, with the cycle's token when it has one (reads may need it:
    `checks serve --token-reads`, with a token that has scope `read` too)."""
    try:
        token = runner.client_token()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{checks_url.rstrip('/')}/v1/results", headers=headers, timeout=10)
    response.raise_for_status()
    return response.json()["results"]


def periodic_units(checks_url: str, names: tuple[str, ...], every: float, nodes: dict) -> list[Unit]:  # type: ignore[type-arg]
    """Each named check on each idle node whose last run is older than ``every`` seconds."""
    import time

    if not names:
        return []
    results = _results(checks_url)
    last = {(r["node"], r["check"]): r["finished"] for r in results}
    now = time.time()
    return [
        Unit(name, (node,))
        for node, view in sorted(nodes.items())
        if view.state == "idle"
        for name in names
        if now - last.get((node, name), 0.0) >= every
    ]


@cli.command("kube-cycle")
@click.option("--checks-url", required=True, help="The checks service (the Jobs post their results there).")
@click.option("--health-url", default=None, help="The health service: validation requests come from it.")
@click.option(
    "--kubeconfig", type=click.Path(path_type=Path), default=None, help="Default: the pod's service account."
)
@click.option("--tools-in-job", default=None, help="The tools file inside the check Jobs' image.")
@click.option("--namespace", default="fleetsight", show_default=True)
@click.option(
    "--token-secret",
    envvar="FLEETSIGHT_CHECKS_TOKEN_SECRET",
    default=None,
    help="The Secret (in --namespace, key `token`) whose bearer token the check Jobs post their results "
    "with (scope `results`): their FLEETSIGHT_CHECKS_TOKEN.",
)
@click.option("--image", default="ghcr.io/fleetsight/fleetsight:latest", show_default=True)
@click.option("--leaf-map", type=click.Path(path_type=Path), default=None, help="YAML node -> leaf(s).")
@click.option("--budget", default=2, show_default=True, help="Nodes of the cluster under test at most.")
@click.option(
    "--retry-after", default=3600.0, show_default=True, help="Seconds before a failed validation reruns."
)
@click.option(
    "--jobs-file",
    envvar="FLEETSIGHT_CHECKS_JOBS_FILE",
    type=click.Path(path_type=Path),
    default=None,
    help="jobs.yml: per tool, the image its Jobs run in and its command there (the chart's checks.images).",
)
@click.option(
    "--jobs-config-map",
    envvar="FLEETSIGHT_CHECKS_JOBS_CONFIGMAP",
    default=None,
    help="The ConfigMap holding jobs.yml, mounted in the Jobs that run FleetSight beside their tool.",
)
@scans_option
@click.option("--catalog", "catalog_file", type=click.Path(path_type=Path), default=CATALOG_FILE)
def kube_cycle_command(**options) -> None:  # type: ignore[no-untyped-def]
    """One pass on Kubernetes: validation checks as pinned Jobs, then the results as node labels.

    \b
    Examples:
      fleetsight checks kube-cycle --checks-url http://checks:9443 --health-url http://health:9441
    """
    from .kube import KubeChecks, KubeClient, load_jobs_file
    from .scan_cycle import plan_scans, post_reports
    from .slurm import validation_requests

    catalog = _catalog(options["catalog_file"])
    images: dict[str, Any] = {}
    commands: dict[str, list[str]] = {}
    if options["jobs_file"]:
        try:
            images, commands = load_jobs_file(options["jobs_file"])
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise click.ClickException(f"--jobs-file: {exc}") from exc
    api = KubeClient(options["kubeconfig"])
    kube = KubeChecks(
        api, catalog, options["checks_url"], ["fleetsight"], image=options["image"],
        namespace=options["namespace"], budget=options["budget"], tools=options["tools_in_job"],
        leaf_map=load_leaf_map(options["leaf_map"]) if options["leaf_map"] else {},
        token_secret=options["token_secret"], images=images, tool_commands=commands,
        jobs_config_map=options["jobs_config_map"],
    )  # fmt: skip
    health = options["health_url"]
    wanted = validation_requests(health, catalog, options["retry_after"]) if health else []
    results = _results(options["checks_url"])
    nodes = [n["metadata"]["name"] for n in api.request("GET", "/api/v1/nodes")["items"]]
    by_key = {(r["node"], r["check"]): r for r in results}
    scans = plan_scans(options["scans"], options["checks_url"], nodes, kube.running(by_key))
    kube.caps = scans.caps
    decision = kube.cycle(wanted + scans.units, nodes, by_key)
    reports = post_reports(options["checks_url"], scans, decision)
    kube.label_results(results)
    started = [{"check": u.check, "nodes": list(u.nodes)} for u in decision.start]
    waiting = [{"check": u.check, "nodes": list(u.nodes), "why": w} for u, w in decision.waiting.items()]
    click.echo(json.dumps({"started": started, "waiting": waiting, "scans": reports}))


cli.add_command(scan_plan_command)
