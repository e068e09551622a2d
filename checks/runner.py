"""Run one check on this node: the tool as configured (a command or a URL), judged by its parser, as
one result record. This is what a light-check timer and an intrusive check's scheduler job execute."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from fleetsight.secrets import SecretFileError, read_secret_file

from . import parsers
from .catalog import Check
from .outcomes import Verdict

TOOLS_FILE = Path(__file__).resolve().parent / "tools.yml"


@dataclass(frozen=True)
class Tools:
    """How each tool is reached: a command line (a list), a URL, or a URL with the credentials of an
    endpoint behind TLS and basic auth (the Debian node agent's: ``{url, ca_file, password_file,
    username, server_name}``)."""

    entries: dict[str, list[str] | str | dict[str, str]]

    def command(self, tool: str, node: str, extra: tuple[str, ...] = (), **values: str) -> list[str]:
        entry = self.entries.get(tool)
        if not isinstance(entry, list):
            raise ValueError(f"tool {tool!r} is not a command in the tools file")
        fill = {"node": node, **values}
        return [part.format(**fill) for part in [*entry, *extra]]

    def is_url(self, tool: str) -> bool:
        return isinstance(self.entries.get(tool), str | dict)

    def url(self, tool: str, node: str) -> str:
        entry = self.entries.get(tool)
        url = entry.get("url") if isinstance(entry, dict) else entry
        if not isinstance(url, str):
            raise ValueError(f"tool {tool!r} is not a URL in the tools file")
        # ${VAR}: what only the node knows (a pod's $HOST_IP from the downward API, in the chart)
        return os.path.expandvars(url.format(node=node))

    def read(self, tool: str, node: str) -> str:
        entry = self.entries.get(tool)
        return _get(self.url(tool, node), entry if isinstance(entry, dict) else {})


URL_KEYS = {"url", "ca_file", "password_file", "username", "server_name"}


def _valid_entry(entry: object) -> bool:
    if isinstance(entry, str):
        return True
    if isinstance(entry, list):
        return all(isinstance(p, str) for p in entry)
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("url"), str)
        and set(entry) <= URL_KEYS
        and all(isinstance(v, str) for v in entry.values())
    )


def load_tools(path: Path = TOOLS_FILE) -> Tools:
    raw = yaml.safe_load(path.read_text()) or {}
    entries = raw.get("tools") if isinstance(raw, dict) else None
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: expected a 'tools' mapping")
    for name, entry in entries.items():
        if not _valid_entry(entry):
            raise ValueError(
                f"{path}: tool {name}: expected a command list, a URL or a mapping with "
                f"{', '.join(sorted(URL_KEYS))}"
            )
    return Tools(entries)


STATUS = {"passed": "PASS", "failed": "ERR", "unknown": "UNKNOWN"}


def record(check: Check, node: str, verdict: Verdict, started: float, finished: float) -> dict[str, Any]:
    """One result. ``outcome`` is the contract (passed, failed, unknown); ``passed`` is true only for a
    pass, false for a failure and null for an unknown, so that a reader that only knows ``passed`` never
    takes an unknown for a pass nor, if it checks ``is False``, for a failure."""
    item = {
        "node": node,
        "check": check.name,
        "kind": check.kind,
        "outcome": verdict.outcome,
        "passed": None if verdict.outcome == "unknown" else verdict.passed,
        "status": STATUS[verdict.outcome],
        "summary": verdict.summary,
        "evidence": verdict.evidence,
        "started": started,
        "finished": finished,
        "runbook": check.runbook,
    }
    if verdict.reason:
        item["reason"] = verdict.reason
    return item


def outcome_of(item: Mapping[str, Any]) -> str:
    """A result's outcome; a result from a poster older than outcomes has only ``passed`` (true/false)."""
    outcome = item.get("outcome")
    if outcome is None:
        return "passed" if item.get("passed") is True else "failed"
    return str(outcome)


def status_of(item: Mapping[str, Any]) -> str:
    """PASS, ERR or UNKNOWN: the word a node label or a scheduler comment shows."""
    return STATUS.get(outcome_of(item), "UNKNOWN")


class Blind(Exception):
    """The tool could not be run or read: the check's result is an unknown with this ``reason``."""

    def __init__(self, reason: str, summary: str) -> None:
        super().__init__(summary)
        self.reason, self.summary = reason, summary

    def verdict(self) -> Verdict:
        return Verdict.blind(self.reason, self.summary)


def _run(command: list[str], timeout: float) -> str:
    """The tool's stdout; a tool that fails still has its say (dcgmi exits non-zero on a failed test
    and prints the JSON all the same). A tool that is not installed, may not be run, or hangs raises
    :class:`Blind`: that says nothing about the node."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise Blind("tool_missing", f"tool not found: {command[0]}") from None
    except PermissionError:
        raise Blind("tool_missing", f"tool not executable: {command[0]}") from None
    except subprocess.TimeoutExpired:
        raise Blind("timeout", f"{command[0]} timed out after {timeout:.0f} s") from None
    if done.returncode in (NOT_FOUND, 126) and not done.stdout.strip():  # a wrapper's shell: no such tool
        raise Blind("tool_missing", f"{command[0]}: {done.stderr.strip()[:200] or 'command not found'}")
    return done.stdout if done.stdout.strip() else done.stderr


def _get(url: str, auth: dict[str, str] | None = None) -> str:
    """The page; with ``auth``, TLS checked against the site's CA for the name the certificate is issued
    for, and basic auth with the password from its file. A page that cannot be had raises :class:`Blind`
    with the reason an operator fixes: unreachable, timeout, tls, unauthorised."""
    auth = auth or {}
    verify: ssl.SSLContext | bool = True
    credentials: tuple[str, str] | None = None
    try:
        if "ca_file" in auth:
            verify = ssl.create_default_context(cafile=auth["ca_file"])
        if "password_file" in auth:
            password = read_secret_file(auth["password_file"], "password_file")
            credentials = (auth.get("username", "prometheus"), password)
    except (SecretFileError, OSError, ssl.SSLError) as exc:
        # credentials the check cannot read say nothing about the node: an unknown, never a failure
        raise Blind("unauthorised", f"cannot load the credentials for {url}: {exc}") from None
    # the name the certificate is issued for, when the URL names another (a node-local Service)
    extensions = {"sni_hostname": auth["server_name"]} if "server_name" in auth else None
    try:
        with httpx.Client(verify=verify, timeout=10) as client:
            response = client.get(url, auth=credentials, extensions=extensions)
    except httpx.TimeoutException as exc:
        raise Blind("timeout", f"{url} did not answer in time: {exc}") from None
    except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
        # a TLS mismatch shows as a connect error whose cause is an SSL error, or as a plain-HTTP server
        # hanging up on a TLS hello (and the other way round)
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ssl.SSLError) or "SSL" in str(exc) or isinstance(exc, httpx.RemoteProtocolError):
            raise Blind("tls", f"TLS does not match at {url}: {exc}") from None
        raise Blind("unreachable", f"cannot reach {url}: {exc}") from None
    except (httpx.HTTPError, OSError) as exc:
        raise Blind("unreachable", f"cannot read {url}: {exc}") from None
    if response.status_code in (401, 403):
        raise Blind("unauthorised", f"{url} answered {response.status_code} (credentials?)")
    if response.status_code >= 400:
        raise Blind("unreachable", f"{url} answered {response.status_code}")
    return response.text


def run_check(check: Check, node: str, tools: Tools, window_s: float | None = None) -> dict[str, Any]:
    """One single-node check here (a pair check runs through :func:`run_pair_client` and
    :func:`run_pair_server`, one on each node)."""
    started = time.time()
    try:
        verdict = _judge(check, node, tools, window_s)
    except Blind as blind:
        verdict = blind.verdict()
    return record(check, node, verdict, started, time.time())


TIMED_OUT, NOT_FOUND = 124, 127  # `timeout`'s status when it killed the tool; the shell's, no such command


def judge_output(check: Check, node: str, folder: Path) -> dict[str, Any]:
    """Judge what the tool printed in another container (``folder/stdout``, its status ``folder/rc``):
    no output file, a command not found or a timeout is an unknown, as when the tool runs here."""
    started = time.time()
    try:
        status = (folder / "rc").read_text().strip() if (folder / "rc").exists() else ""
        if not (folder / "stdout").exists() or status == str(NOT_FOUND):
            raise Blind("tool_missing", f"{check.tool} did not run in its container (no output in {folder})")
        if status == str(TIMED_OUT):
            raise Blind("timeout", f"{check.tool} timed out after {2 * check.seconds:.0f} s")
        judge = parsers.ONE_SHOT.get(check.parser)
        if judge is None:
            raise Blind("not_run", f"{check.name} is not judged from one output ({check.parser})")
        verdict = judge((folder / "stdout").read_text(errors="replace"), check.params)
    except Blind as blind:
        verdict = blind.verdict()
    return record(check, node, verdict, started, time.time())


def _judge(check: Check, node: str, tools: Tools, window_s: float | None) -> Verdict:
    if check.parser == "link_errors":  # the same page twice, a window apart: a measurement, not a wait
        before = tools.read(check.tool, node)
        time.sleep(window_s if window_s is not None else float(check.params.get("window_seconds", 30)))
        return parsers.link_errors(before, tools.read(check.tool, node), check.params)
    if check.nodes == 2:
        return Verdict.blind("not_run", f"{check.name} runs on two nodes: `fleetsight checks pair`")
    if tools.is_url(check.tool):
        return parsers.ONE_SHOT[check.parser](tools.read(check.tool, node), check.params)
    text = _run(tools.command(check.tool, node, check.args), 2 * check.seconds)
    return parsers.ONE_SHOT[check.parser](text, check.params)


# ---------------------------------------------------------------------------------- pair checks
def _devices(check: Check) -> list[str]:
    return [f"mlx5_{p}" for p in check.params.get("ports", range(8))]


def _pair_args(check: Check, index: int, device: str) -> tuple[str, ...]:
    """The catalogue's arguments for one port, on its own perftest TCP port: the servers of every port
    listen at once, so each needs its own."""
    args = tuple(a.format(device=device, port="1") for a in check.args)
    return (*args, "-p", str(int(check.params.get("tcp_port_base", 18515)) + index))


def run_pair_server(check: Check, node: str, partner: str, tools: Tools) -> list[str]:
    """The server side: one ib_write_bw server per port, all at once; each ends when its client has
    measured. Returns their outputs (the client side records the result for both nodes)."""
    servers = [
        subprocess.Popen(
            tools.command(check.tool, node, _pair_args(check, i, device), partner=partner, device=device),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, device in enumerate(_devices(check))
    ]
    deadline = time.monotonic() + 2 * check.seconds
    outputs = []
    for server in servers:
        try:
            outputs.append(server.communicate(timeout=max(0.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:  # the client never came: its node is down or never started
            server.kill()
            outputs.append(server.communicate()[0] + "\n(no client before the time limit)")
    return outputs


NOT_LISTENING = "Couldn't connect to"  # perftest's client, when no server listens yet on the TCP port


def _client(command: list[str], check: Check) -> str:
    """One port's client run; perftest does not retry its TCP handshake, so while the partner's server
    is still starting (the pair's two sides start independently) the run is repeated, for at most
    ``connect_wait_seconds``."""
    deadline = time.monotonic() + float(check.params.get("connect_wait_seconds", 30))
    while True:
        try:
            text = _run(command, 2 * check.seconds)
        except Blind as blind:
            return blind.summary  # the parser finds no figures in it: this port is an unknown
        if NOT_LISTENING not in text or time.monotonic() >= deadline:
            return text
        time.sleep(0.5)  # bounded retry of a handshake, not a synchronisation of tests


def run_pair_client(
    check: Check, node: str, partner: str, tools: Tools, address: str | None = None
) -> list[dict[str, Any]]:
    """The client side, towards the partner's servers on every port: one result per node of the pair,
    each with the result per port (a port is a link between the two, so it answers for both)."""
    started = time.time()
    ports: dict[str, Any] = {}
    for i, device in enumerate(_devices(check)):
        args = (*_pair_args(check, i, device), address or partner)
        text = _client(tools.command(check.tool, node, args, partner=partner, device=device), check)
        verdict = parsers.ib_write_bw(text, check.params)
        ports[device] = {
            "outcome": verdict.outcome,
            "passed": verdict.passed,
            "summary": verdict.summary,
            **verdict.evidence,
        }
    bad = sorted(d for d, p in ports.items() if not p["passed"])
    # one slow port fails the pair; ports that could not be measured (no figures) only make it unknown
    failed = any(p["outcome"] == "failed" for p in ports.values())
    finished = time.time()
    results = []
    for here, there, role in ((node, partner, "client"), (partner, node, "server")):
        evidence = {"partner": there, "role": role, "ports": ports}
        if not bad:
            verdict = Verdict.judged(True, f"{len(ports)} ports at line rate towards {there}", evidence)
        elif failed:
            summary = f"slow or unreadable towards {there}: {', '.join(bad)}"
            verdict = Verdict.judged(False, summary, evidence)
        else:
            summary = f"could not measure towards {there}: {', '.join(bad)}"
            verdict = Verdict.blind("unreadable", summary, evidence)
        results.append(record(check, here, verdict, started, finished))
    return results


TOKEN_ENV = "FLEETSIGHT_CHECKS_TOKEN"
TOKEN_FILE_ENV = "FLEETSIGHT_CHECKS_TOKEN_FILE"


def client_token(environ: Mapping[str, str] = os.environ) -> str | None:
    """The bearer token (scope ``results``) a check sends with its results: FLEETSIGHT_CHECKS_TOKEN, or
    the first line of the file FLEETSIGHT_CHECKS_TOKEN_FILE names (a Secret's mount, a root-only file on
    the node). ValueError if that file cannot be read or is empty; None when neither is set."""
    path = environ.get(TOKEN_FILE_ENV)
    if path:
        return read_secret_file(path, TOKEN_FILE_ENV).splitlines()[0].strip()
    return environ.get(TOKEN_ENV, "").strip() or None


def post_results(url: str, results: list[dict[str, Any]], token: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    httpx.post(f"{url.rstrip('/')}/v1/results", json=results, headers=headers, timeout=10).raise_for_status()


EXIT_UNKNOWN = 4  # no check failed, but one could not observe (1: a check failed; 3: not reported)


def exit_code(results: list[dict[str, Any]]) -> int:
    """0 when every check passed, 1 when one failed, EXIT_UNKNOWN when none failed but one was blind."""
    outcomes = {r.get("outcome") for r in results}
    return 1 if "failed" in outcomes else EXIT_UNKNOWN if "unknown" in outcomes else 0


def dumps(results: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(r, sort_keys=True) for r in results)
