"""Alertmanager in the local stack, in production's shape: a pair (A and B) clustered over loopback, so
that one alert gives one Slack message, and the Slack stand-in that records what would be posted.

Both replicas run the production routing file (alerting/alertmanager.yml, or a site's own file named by
FLEETSIGHT_ALERTMANAGER_CONFIG) with only paths changed: the secrets it reads from
/etc/alertmanager/secrets/ come from a local folder. By default that folder holds a webhook URL
pointing at the Slack stand-in; FLEETSIGHT_ALERTMANAGER_SECRETS_DIR points it at an operator's real
secrets instead. Before a replica starts, the derived file is checked with amtool, every
secret file it names must exist, and every URL must be http(s): a mistake stops that replica with an
error naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from fleetsight.components import Component, http_ok, missing_binary
from fleetsight.settings import SLACK_STAND_IN_ENV, Settings
from fleetsight.setup import apt_step
from fleetsight.supervisor import runs_here

from .log_alerts import (
    ELASTALERT_INSTALL_STEP,
    elastalert_command,
    elastalert_missing,
    elastalert_ready,
    prepare_elastalert,
)

PRODUCTION_CONFIG = Path(__file__).with_name("alertmanager.yml")
# A site's own routing file instead of alerting/alertmanager.yml (same format, same secret paths).
CONFIG_ENV = "FLEETSIGHT_ALERTMANAGER_CONFIG"
PRODUCTION_SECRETS_DIR = "/etc/alertmanager/secrets/"
SECRETS_DIR_ENV = "FLEETSIGHT_ALERTMANAGER_SECRETS_DIR"
SLACK_SECRET = "slack_webhook_url"
# The bearer token of the health service's webhook receiver; the service reads the same file.
HEALTH_TOKEN_SECRET = "health_events_token"
HEALTH_RECEIVER = "fleetsight-health"
HEALTH_EVENTS_PATH = "/v1/events/alertmanager"
REPLICAS = ("A", "B")
AMTOOL_TIMEOUT_S = 60


class ConfigError(ValueError):
    """The Alertmanager configuration or one of its secrets is wrong; the message says which."""


def replica_name(replica: str) -> str:
    return "alertmanager" if replica == "A" else f"alertmanager-{replica.lower()}"


def port_names(replica: str) -> tuple[str, str]:
    """(web, cluster) port names of a replica."""
    stem = "alertmanager" if replica == "A" else f"alertmanager_{replica.lower()}"
    return stem, f"{stem}_cluster"


def slack_record_file(settings: Settings) -> Path:
    return settings.data_dir("slack-sink") / "messages.jsonl"


def slack_stand_in_url(settings: Settings) -> str:
    """The webhook URL of the stack's Slack stand-in (what a real Slack incoming webhook would be)."""
    return settings.url("slack_sink", "/services/local/webhook")


def secrets_dir(settings: Settings) -> Path:
    """Where the local stack reads the secrets that production mounts under /etc/alertmanager/secrets/."""
    configured = os.environ.get(SECRETS_DIR_ENV)
    return Path(configured).expanduser() if configured else settings.config_dir("alertmanager")


def write_stand_in_secret(settings: Settings) -> None:
    """Without an operator's secrets folder, the webhook URL is the local Slack stand-in's."""
    if os.environ.get(SECRETS_DIR_ENV):
        return
    folder = secrets_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    secret = folder / SLACK_SECRET
    # FLEETSIGHT_SLACK_STAND_IN_URL: another stack's stand-in (with `fleetsight up --clusters N` every
    # cluster's pair posts to the global layer's one: a fleet has one Slack workspace).
    secret.write_text(os.environ.get(SLACK_STAND_IN_ENV) or slack_stand_in_url(settings))
    secret.chmod(0o600)
    token = folder / HEALTH_TOKEN_SECRET
    if not token.exists():  # kept across restarts: the running health service holds it
        token.write_text(secrets.token_urlsafe(32))
        token.chmod(0o600)


def health_token_file(settings: Settings) -> Path:
    """The webhook token file the local stack's health service reads (--events-token-file)."""
    return secrets_dir(settings) / HEALTH_TOKEN_SECRET


def local_health_url(config: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The health receiver's webhook pointed at the local stack's health service (production names
    the compose service); with the health pair in the stack, at both replicas (as a Service in front of
    both pods would be): either may be down, and a follower forwards what it gets to the leader."""
    replicas = ["health"] + (["health_b"] if runs_here(settings, "health-b") else [])
    for receiver in config.get("receivers", []):
        if receiver.get("name") == HEALTH_RECEIVER:
            template = receiver.get("webhook_configs", [{}])[0]
            receiver["webhook_configs"] = [
                {**template, "url": settings.url(port, HEALTH_EVENTS_PATH)} for port in replicas
            ]
    return config


def localised(node: Any, settings: Settings) -> Any:
    """The production configuration with every secret path moved to the local secrets folder."""
    if isinstance(node, dict):
        return {key: localised(value, settings) for key, value in node.items()}
    if isinstance(node, list):
        return [localised(value, settings) for value in node]
    if isinstance(node, str) and node.startswith(PRODUCTION_SECRETS_DIR):
        return str(secrets_dir(settings) / node.removeprefix(PRODUCTION_SECRETS_DIR))
    return node


def walk(node: Any, where: str = "") -> Iterator[tuple[str, str, Any]]:
    """(location, key, value) of every mapping entry, depth first (receivers[2].slack_configs[0])."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield where, key, value
            yield from walk(value, f"{where}.{key}" if where else key)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{where}[{index}]")


def describe(config: dict[str, Any], location: str) -> str:
    """`receivers[1].slack_configs[0]` -> `receiver 'slack-critical' slack_configs[0]`."""
    if location.startswith("receivers["):
        index = int(location[len("receivers[") : location.index("]")])
        rest = location[location.index("]") + 2 :]
        return f"receiver {config['receivers'][index].get('name')!r} {rest}".strip()
    return location or "top level"


def bad_url(value: str) -> str | None:
    url = urlparse(value.strip())
    if url.scheme not in ("http", "https") or not url.netloc:
        return "is not an http(s) URL"
    return None


def secret_problems(config: dict[str, Any]) -> list[str]:
    """Secret files that are missing, unreadable or empty, and URLs (inline or in a *url_file) that
    are not http(s)."""
    problems = []
    for location, key, value in walk(config):
        if not isinstance(value, str):
            continue
        where = f"{describe(config, location)} {key}"
        if key.endswith("_file"):
            path = Path(value)
            try:
                content = path.read_text().strip()
            except OSError as exc:
                problems.append(f"{where}: secret file {path} cannot be read ({exc.strerror or exc})")
                continue
            if not content:
                problems.append(f"{where}: secret file {path} is empty")
            elif key.endswith("url_file") and (reason := bad_url(content)):
                problems.append(f"{where}: the URL in secret file {path} {reason}")  # never print it
        elif key in ("api_url", "url") and (reason := bad_url(value)):
            problems.append(f"{where}: {value!r} {reason}")
    return problems


def source_config() -> Path:
    configured = os.environ.get(CONFIG_ENV)
    return Path(configured).expanduser() if configured else PRODUCTION_CONFIG


def amtool_problem(path: Path) -> str | None:
    try:
        result = subprocess.run(
            ["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=AMTOOL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run amtool check-config: {exc}"
    if result.returncode == 0:
        return None
    output = (result.stdout + result.stderr).replace(str(path), str(source_config()))
    reasons = [line.split("FAILED:", 1)[1].strip() for line in output.splitlines() if "FAILED:" in line]
    failed = [f"amtool: {reason}" for reason in reasons]
    return "; ".join(failed) or output.strip()


def local_config(settings: Settings) -> dict[str, Any]:
    source = source_config()
    try:
        config = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: cannot be read as YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: not an Alertmanager configuration (a YAML mapping)")
    return local_health_url(localised(config, settings), settings)


def config_path(settings: Settings) -> Path:
    return settings.config_dir("alertmanager") / "alertmanager.yml"


def prepare(settings: Settings) -> None:
    """The production routing file with local secret paths, checked before any replica starts."""
    write_stand_in_secret(settings)
    path = config_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = local_config(settings)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    problems = [p for p in [amtool_problem(path), *secret_problems(config)] if p]
    if problems:
        raise ConfigError(f"{source_config()}: " + "; ".join(problems))


def validate(settings: Settings) -> None:
    """The same preparation and checks in a scratch run folder: a pre-flight check that touches none of
    the stack's files (``extra["validate"]`` of each replica)."""
    with tempfile.TemporaryDirectory(prefix="fleetsight-check-") as scratch:
        prepare(dataclasses.replace(settings, run_dir=Path(scratch)))


def prepare_replica(settings: Settings, replica: str) -> None:
    prepare(settings)
    settings.data_dir(replica_name(replica)).mkdir(parents=True, exist_ok=True)


def command(settings: Settings, replica: str) -> list[str]:
    web, cluster = port_names(replica)
    peers = [port_names(other)[1] for other in REPLICAS if other != replica]
    return [
        "prometheus-alertmanager",
        f"--config.file={config_path(settings)}",
        f"--storage.path={settings.data_dir(replica_name(replica))}",
        f"--web.listen-address=127.0.0.1:{settings.port(web)}",
        # The pair gossips its notification log over loopback: the first replica notifies, the other
        # sees that it did and stays quiet (one alert, one Slack message).
        f"--cluster.listen-address=127.0.0.1:{settings.port(cluster)}",
        *(f"--cluster.peer=127.0.0.1:{settings.port(peer)}" for peer in peers),
    ]


def alertmanager_component(replica: str) -> Component:
    web, _ = port_names(replica)
    return Component(
        name=replica_name(replica),
        description=f"Alertmanager {replica} of the clustered pair: routes every alert to Slack",
        command=lambda s: command(s, replica),
        prepare=lambda s: prepare_replica(s, replica),
        ready=lambda s: http_ok(s.url(web, "/-/ready")),
        urls=lambda s: {"ui": s.url(web)},
        missing=lambda s: missing_binary("prometheus-alertmanager", "amtool"),
        depends_on=("slack-sink",),
        extra={"validate": validate},
    )


COMPONENTS = [
    Component(
        name="slack-sink",
        description="Slack stand-in: records what Alertmanager would post to Slack",
        command=lambda s: [
            sys.executable,
            "-m",
            f"{__package__}.slack_sink",
            f"--listen=127.0.0.1:{s.port('slack_sink')}",
            f"--record={slack_record_file(s)}",
        ],
        ready=lambda s: http_ok(s.url("slack_sink", "/")),
        urls=lambda s: {"messages": s.url("slack_sink", "/")},
    ),
    *(alertmanager_component(replica) for replica in REPLICAS),
    Component(
        name="elastalert",
        description="ElastAlert2: alerts from logs (alerting/elastalert/rules) -> Alertmanager",
        command=elastalert_command,
        prepare=prepare_elastalert,
        ready=elastalert_ready,
        missing=elastalert_missing,
        depends_on=("opensearch", "alertmanager"),
        ready_timeout_s=120.0,
    ),
]

PORTS = {
    "alertmanager": 93,
    "alertmanager_cluster": 94,
    "slack_sink": 95,
    "alertmanager_b": 96,
    "alertmanager_b_cluster": 97,
}
START_PRIORITY = 10
INSTALL_STEPS = [
    apt_step(
        "alertmanager",
        "Debian's Alertmanager (prometheus-alertmanager, amtool)",
        "alertmanager A/B",
        {"prometheus-alertmanager": "prometheus-alertmanager"},
    ),
    ELASTALERT_INSTALL_STEP,
]
