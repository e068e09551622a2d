"""`fleetsight exporter` sub-commands: the node agent and the fabric exporter."""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import yaml

from fleetsight import webconfig

from . import node_web_files, serving
from .core import configure_logging, kv
from .node import (
    COLLECTORS,
    NodeAgent,
    NodeOptions,
    NodeSet,
    advertised_address,
    node_set_pages,
    single_node_pages,
)
from .state import SYSTEM_STATE_DIR, check_writable, default_state_dir

log = logging.getLogger("fleetsight.exporters")


def load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--config FILE``: a YAML mapping of option names (``sysfs_root: /host/sys``) used as defaults;
    flags on the command line win."""
    if value:
        try:
            data = yaml.safe_load(Path(value).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise click.BadParameter(f"cannot read {value}: {exc}") from exc
        if not isinstance(data, dict):
            raise click.BadParameter(f"{value} must hold a mapping of option names to values")
        aliases = option_aliases(ctx.command)
        unknown = sorted(k for k in data if str(k).replace("-", "_") not in aliases)
        if unknown:
            raise click.BadParameter(f"{value}: unknown option(s) {', '.join(map(str, unknown))}")
        defaults = {aliases[str(k).replace("-", "_")]: v for k, v in data.items()}
        ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def option_aliases(command: click.Command) -> dict[str, str]:
    """Option names as a file may write them -> parameter names: as the flag is (``sysfs-root``,
    ``collector``) or as the parameter (``sysfs_root``, ``collectors``)."""
    aliases = {}
    for param in command.params:
        if param.name is None:
            continue
        aliases[param.name] = param.name
        for flag in getattr(param, "opts", []):
            aliases[flag.lstrip("-").replace("-", "_")] = param.name
    return aliases


config_option = click.option(
    "--config",
    type=click.Path(dir_okay=False),
    callback=load_config,
    is_eager=True,
    expose_value=False,
    help="YAML file of option defaults (keys are option names).",
)


def settle_memory() -> None:
    """Start-up objects (modules, inventories) live forever: move them out of the garbage collector's
    sight, and collect young objects less often (a scrape allocates ~20,000 short-lived ones)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


def wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


@click.group(name="exporter", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The node agent and the fabric exporter (Prometheus endpoints). The examples run as written from
    the repository root; those with 127.0.0.1:19100 read the twin of a running `fleetsight up`.

    \b
    Examples:
      fleetsight exporter node --once --no-state --collector xid --collector lustre \\
          --procfs-root tests/exporters/fixtures/lustre/proc \\
          --kmsg-file tests/exporters/fixtures/kernlog/xid_generations.log
      fleetsight exporter node --once --no-state --nodes-file tests/exporters/fixtures/nodes.json
      fleetsight exporter fabric --once --ufm-url http://127.0.0.1:19100/ufm    (with `fleetsight up`)
    """


@cli.command()
@config_option
@click.option(
    "--node",
    default=socket.gethostname().split(".")[0],
    show_default=True,
    help="Node name, exported as the `node` label.",
)
@click.option(
    "--listen", default="0.0.0.0:9401", show_default=True, help="HOST:PORT of the metrics endpoint."
)
@click.option(
    "--web.config.file",
    "web_config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TLS and basic auth for the endpoint, in exporter-toolkit's format (as node_exporter's).",
)
@click.option("--once", is_flag=True, help="Print one scrape (Prometheus text format) and exit.")
@click.option(
    "--collector",
    "collectors",
    multiple=True,
    type=click.Choice(COLLECTORS),
    help="Enable only these collectors (repeatable; default: all that are configured).",
)
@click.option("--sysfs-root", default="/sys", show_default=True)
@click.option("--procfs-root", default="/proc", show_default=True)
@click.option(
    "--kmsg-file",
    default="/dev/kmsg",
    show_default=True,
    help="/dev/kmsg, or a kernel log file in syslog format (e.g. /var/log/kern.log).",
)
@click.option(
    "--kernel-log-format",
    type=click.Choice(["auto", "kmsg", "syslog"]),
    default="auto",
    show_default=True,
    help="Format of --kmsg-file: kmsg records (seq numbers) or syslog lines; auto: kmsg for a device.",
)
@click.option("--journald", is_flag=True, help="Read kernel messages from journald instead.")
@click.option("--journalctl", default="journalctl", show_default=True, hidden=True)
@click.option("--redfish-url", help="BMC base URL (https://bmc-host); enables the Redfish BMC collector.")
@click.option("--ipmitool", help="ipmitool command; enables the IPMI BMC collector (BMCs without Redfish).")
@click.option("--ipmi-host", help="BMC address for ipmitool over LAN (default: the local BMC).")
@click.option(
    "--bmc-credentials-file",
    type=click.Path(dir_okay=False),
    help="File with 'user:password' (else FLEETSIGHT_BMC_USERNAME/FLEETSIGHT_BMC_PASSWORD).",
)
@click.option("--bmc-insecure", is_flag=True, help="Do not verify the BMC's TLS certificate.")
@click.option("--bmc-ca-file", type=click.Path(dir_okay=False), help="CA bundle for the BMC's certificate.")
@click.option("--bmc-timeout", default=3.0, show_default=True, help="Seconds per BMC request.")
@click.option("--bmc-interval", default=30.0, show_default=True, help="Seconds between BMC polls.")
@click.option("--lctl", help="Read Lustre stats from `lctl get_param` (command) instead of the folders.")
@click.option("--lustre-jobstats", is_flag=True, help="Also export Lustre job statistics (costly).")
@click.option(
    "--pcie-bandwidth-file",
    type=click.Path(dir_okay=False),
    help="Health probe results (JSON) to export; with --pcie-probe cuda, where to save them.",
)
@click.option(
    "--pcie-probe",
    type=click.Choice(["auto", "file", "cuda", "off"]),
    default="auto",
    show_default=True,
    help="auto: export --pcie-bandwidth-file if given; cuda: measure here.",
)
@click.option(
    "--pcie-probe-interval", default=3600.0, show_default=True, help="Seconds between measurements."
)
@click.option(
    "--gpu-map",
    type=click.Path(dir_okay=False),
    help="JSON list of {gpu, pci_bdf, uuid} (else NVML, else sysfs order).",
)
@click.option("--nvml/--no-nvml", default=True, show_default=True, help="Ask NVML for the GPU map.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Where the Xid reader keeps its log position and counts across restarts. Default:"
    f" $STATE_DIRECTORY (systemd), else {SYSTEM_STATE_DIR} if writable, else"
    " $XDG_STATE_HOME/fleetsight/node-agent (~/.local/state/...). --once reads it, never writes it.",
)
@click.option("--no-state", is_flag=True, help="Keep positions and counts in memory only (not restart-safe).")
@click.option("--deadline", default=5.0, show_default=True, help="Seconds a scrape may take at most.")
@click.option(
    "--nodes-file",
    type=click.Path(dir_okay=False),
    help="Serve several nodes from one process: a JSON list of objects whose keys are this command's"
    " option names (node, sysfs_root, procfs_root, kmsg_file, redfish_url...; the command line fills the"
    " rest), at /nodes/<node>/metrics, with /targets.json for Prometheus http_sd. Re-read when it changes.",
)
@click.option("--log-level", default="INFO", show_default=True)
def node(**options: Any) -> None:
    """Run the node agent: PCIe, InfiniBand, Xid, BMC, Lustre and health-probe collectors. The examples
    run as written from the repository root; the last one reads a twin node of a running `fleetsight up`.

    \b
    Examples:
      fleetsight exporter node                              this host, defaults everywhere
      fleetsight exporter node --once --no-state --node n0007 --collector xid --collector lustre \\
          --procfs-root tests/exporters/fixtures/lustre/proc \\
          --kmsg-file tests/exporters/fixtures/kernlog/xid_generations.log
      fleetsight exporter node --once --no-state --nodes-file tests/exporters/fixtures/nodes.json
      fleetsight exporter node --once --no-state --node n0001 \\
          --sysfs-root run/data/twin/nodes/n0001/sys --procfs-root run/data/twin/nodes/n0001/proc \\
          --kmsg-file run/data/twin/nodes/n0001/var/log/kern.log \\
          --redfish-url http://127.0.0.1:19100/bmc/n0001     a twin node (with `fleetsight up`)
    """
    configure_logging(options["log_level"])
    opts = node_options(options)
    announce_state_dir(opts, options)
    if options["nodes_file"]:
        run_node_set(options)
        return
    try:
        agent = NodeAgent(opts)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if options["once"]:
        sys.stdout.write(agent.scrape().decode())
        agent.close()
        return
    server = start_server(options["listen"], single_node_pages(agent), options["web_config_file"])
    settle_memory()
    log.info(kv(event="listening", node=opts.node, address=options["listen"]))
    wait_for_signal()
    server.shutdown()
    agent.close()


def run_node_set(options: dict[str, Any]) -> None:
    """Several nodes from one process, as the nodes file lists them."""
    command = click.get_current_context().command
    nodes = NodeSet(options["nodes_file"], lambda entry: entry_options(entry, options, command))
    try:
        nodes.load()  # a bad file at start is a usage error; later, the old node set stays
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    nodes.refresh()
    if nodes.problem:
        raise click.ClickException(nodes.problem)
    if options["once"]:
        sys.stdout.write(nodes.scrape_all().decode())
        nodes.close()
        return
    pages = node_set_pages(nodes, advertised_address(options["listen"]))
    server = start_server(options["listen"], pages, options["web_config_file"])
    settle_memory()
    log.info(kv(event="listening", nodes=len(nodes.agents), address=options["listen"], nodes_file=nodes.path))
    wait_for_signal()
    server.shutdown()
    nodes.close()


# Options that belong to the process, not to a node: a nodes file may not set them.
PROCESS_OPTIONS = {"listen", "once", "nodes_file", "log_level", "config", "web_config_file"}


def entry_options(entry: dict, options: dict[str, Any], command: click.Command) -> NodeOptions:
    """A nodes-file entry over the command line's options; raises ValueError naming what is wrong."""
    aliases = option_aliases(command)
    node = entry.get("node", "?")
    unknown = sorted(k for k in entry if aliases.get(str(k).replace("-", "_")) in (None, *PROCESS_OPTIONS))
    if unknown:
        raise ValueError(f"node {node}: unknown or per-process option(s) {', '.join(map(str, unknown))}")
    merged = {**options, **{aliases[str(k).replace("-", "_")]: v for k, v in entry.items()}}
    if isinstance(merged.get("collectors"), str):
        merged["collectors"] = (merged["collectors"],)
    bad = [c for c in merged.get("collectors") or () if c not in COLLECTORS]
    if bad:
        raise ValueError(f"node {node}: unknown collector(s) {', '.join(map(str, bad))}")
    try:
        return node_options(merged)
    except click.UsageError as exc:
        raise ValueError(f"node {node}: {exc.message}") from exc


def start_server(
    listen: str, pages: Callable[[str], serving.Page | None], web_config_file: str | None = None
) -> ThreadingHTTPServer:
    try:
        web = webconfig.load(web_config_file) if web_config_file else None
    except webconfig.WebConfigError as exc:
        raise click.ClickException(f"--web.config.file {exc}") from exc
    try:
        return serving.serve(listen, pages, web)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from exc


def announce_state_dir(opts: NodeOptions, options: dict[str, Any]) -> None:
    """Says where the Xid state is kept (and, loudly, when it cannot be written: the agent then counts
    in memory and a restart would count the current kernel log again)."""
    if "xid" not in opts.collectors:
        return
    if opts.state_dir is None:
        log.warning(kv(event="state_dir", path="none", detail="--no-state: a restart counts old lines again"))
        return
    origin = "--state-dir" if options["state_dir"] else default_state_dir()[1]
    if opts.state_read_only:
        log.info(kv(event="state_dir", path=opts.state_dir, origin=origin, mode="read-only (--once)"))
        return
    problem = check_writable(opts.state_dir)
    if problem:
        log.error(
            kv(
                event="state_dir_unwritable",
                path=opts.state_dir,
                origin=origin,
                error=problem,
                detail="counting in memory; errors_total{source=state} counts failed saves",
            )
        )
    else:
        log.info(kv(event="state_dir", path=opts.state_dir, origin=origin))


def node_options(options: dict[str, Any]) -> NodeOptions:
    if options["redfish_url"] and options["ipmitool"]:
        raise click.UsageError("give either --redfish-url or --ipmitool, not both")
    return NodeOptions(
        node=options["node"],
        sysfs_root=options["sysfs_root"],
        procfs_root=options["procfs_root"],
        kmsg_file=options["kmsg_file"],
        journald=options["journald"],
        journalctl=options["journalctl"],
        redfish_url=options["redfish_url"],
        ipmitool=options["ipmitool"],
        ipmi_host=options["ipmi_host"],
        bmc_credentials_file=options["bmc_credentials_file"],
        bmc_verify_tls=not options["bmc_insecure"],
        bmc_ca_file=options["bmc_ca_file"],
        bmc_timeout_s=options["bmc_timeout"],
        bmc_interval_s=options["bmc_interval"],
        lctl=options["lctl"],
        lustre_jobstats=options["lustre_jobstats"],
        pcie_bandwidth_file=options["pcie_bandwidth_file"],
        pcie_probe=options["pcie_probe"],
        pcie_probe_interval_s=options["pcie_probe_interval"],
        gpu_map_file=options["gpu_map"],
        nvml=options["nvml"],
        state_dir=None if options["no_state"] else (options["state_dir"] or default_state_dir()[0]),
        state_read_only=options["once"],
        kernel_log_format=options["kernel_log_format"],
        deadline_s=options["deadline"],
        collectors=tuple(options["collectors"]) or COLLECTORS,
        # Named explicitly, Lustre or IB is expected here: a host without it is then a failure, not a
        # quiet no.
        lustre_required="lustre" in (options["collectors"] or ()) or bool(options["lctl"]),
        infiniband_required="infiniband" in (options["collectors"] or ()),
    )


@cli.command()
@config_option
@click.option(
    "--ufm-url", required=True, help="UFM base URL (https://ufm-host); REST resources are below it."
)
@click.option(
    "--ufm-telemetry-url", help="UFM Telemetry CSV endpoint for port counters (http://ufm:9001/csv/metrics)."
)
@click.option(
    "--ufm-credentials-file",
    type=click.Path(dir_okay=False),
    help="File with 'user:password' (else FLEETSIGHT_UFM_USERNAME/FLEETSIGHT_UFM_PASSWORD).",
)
@click.option("--ufm-insecure", is_flag=True, help="Do not verify UFM's TLS certificate.")
@click.option("--ufm-ca-file", type=click.Path(dir_okay=False), help="CA bundle for UFM's certificate.")
@click.option("--ufm-timeout", default=10.0, show_default=True, help="Seconds per UFM request.")
@click.option(
    "--data-unit",
    type=click.Choice(["words", "bytes"]),
    default="words",
    show_default=True,
    help="Unit of PortXmitData/PortRcvData in the telemetry (the PMA counts 4-byte words).",
)
@click.option("--interval", default=30.0, show_default=True, help="Seconds between UFM refreshes.")
@click.option(
    "--listen", default="0.0.0.0:9410", show_default=True, help="HOST:PORT of the metrics endpoint."
)
@click.option(
    "--web.config.file",
    "web_config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TLS and basic auth for the endpoint, in exporter-toolkit's format (as node_exporter's).",
)
@click.option("--once", is_flag=True, help="Fetch once, print the metrics (Prometheus text format), exit.")
@click.option("--log-level", default="INFO", show_default=True)
def fabric(**options: Any) -> None:
    """Run the fabric exporter: every port, switch and event UFM knows, with both ends of each link.

    The examples read the twin's UFM of a running `fleetsight up`.

    \b
    Examples:
      fleetsight exporter fabric --once --ufm-url http://127.0.0.1:19100/ufm
      fleetsight exporter fabric --ufm-url http://127.0.0.1:19100/ufm \\
          --ufm-telemetry-url http://127.0.0.1:19100/ufm/csv/metrics --listen 127.0.0.1:9410
    """
    from .fabric import FabricExporter, ufm_credentials

    configure_logging(options["log_level"])
    try:
        credentials = ufm_credentials(options["ufm_credentials_file"])
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    exporter = FabricExporter(
        ufm_url=options["ufm_url"],
        telemetry_url=options["ufm_telemetry_url"],
        interval_s=options["interval"],
        timeout_s=options["ufm_timeout"],
        verify_tls=options["ufm_ca_file"] or not options["ufm_insecure"],
        credentials=credentials,
        data_unit=options["data_unit"],
    )
    if options["once"]:
        sys.stdout.write(exporter.refresh().text.decode())
        exporter.close()
        return
    exporter.start()
    server = start_server(options["listen"], exporter.page, options["web_config_file"])
    log.info(kv(event="listening", address=options["listen"], ufm=options["ufm_url"]))
    wait_for_signal()
    server.shutdown()
    exporter.close()


@cli.command("make-web-config")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Write under this folder instead of / (an image being built, tests).",
)
@click.option(
    "--group",
    default="fleetsight",
    show_default=True,
    help="Group that reads the key, password and configuration (applied when run as root).",
)
def make_web_config(root: Path, group: str) -> None:
    """Make the node agent's web configuration where it is missing: /etc/fleetsight/exporter-web.yml
    (TLS, basic auth for `prometheus`), exporter-tls.crt/.key (issued for fleetsight-exporter, this
    host's name and loopback, by a CA made for it alone: exporter-ca.crt) and exporter-scrape-password.
    The fleetsight-node package runs it at install. It never overwrites: with exporter-web.yml there
    it does nothing; a certificate and key, or a password, already there (the fleet's) are used.

    \b
    Example:
      fleetsight exporter make-web-config --root /tmp/node-root --group "$(id -gn)"
    """
    files = node_web_files.NodeFiles(root)
    hosts = (socket.gethostname(),)  # not getfqdn(): a DNS lookup that can hang an install
    try:
        written = node_web_files.make_node_config(root, group, hosts)
    except (webconfig.WebConfigError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if not written:
        click.echo(f"{files.config} is there: nothing changed")
    for path in written:
        click.echo(f"wrote {path}")
    if not files.ca.exists():
        click.echo(f"note: no {files.ca}: the Slurm healthcheck verifies the agent's certificate with it")
