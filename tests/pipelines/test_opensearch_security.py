"""The role model of ``security/elasticsearch.yml`` enforced by a real server: OpenSearch with its security
plugin (``fleetsight setup`` builds it beside the local one), configured from that file by
pipelines/opensearch_security.py, TLS on HTTP and transport with a CA made for this module, basic auth
only. Each user does what its role allows and is refused the rest, and FleetSight's own clients log in to
it: `logs apply` as the logs admin, the chatbot's log search and the credentials of Grafana's logs
datasource (the file docker-compose.yml provisions, presented by the project's own client) as the
reader. docs/security.md T2, T3, T5."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from logs_helpers import children

from chatbot.config import chat_config
from chatbot.live import gather
from fleetsight.settings import Settings
from pipelines import opensearch_install
from pipelines.apply import ApplyError, SearchServer
from pipelines.es_security import SECURITY_FILE
from pipelines.logclasses import LOG_CLASSES
from pipelines.opensearch_security import SecurityError, configure_node, security_files, translate_role
from support import REPO_ROOT, free_port, wait_until

READY_TIMEOUT_S = 150.0
STOP_TIMEOUT_S = 30.0
LOG_INDEX = "fleetsight-logs-kernel-2026.11.27"
AUDIT_INDEX = "fleetsight-audit-2026.11.27"
NODE = "n0042"
AUDIT_USER = "security-team-test"
# The model has the security team's role but no user for it (they bring their own); this module adds
# one, with that role, to test it.
MODEL = yaml.safe_load(SECURITY_FILE.read_text())
MODEL["users"][AUDIT_USER] = {"roles": ["fleetsight_audit_reader"], "password_secret": "audit-test-password"}
COMPOSE_LOGS_DATASOURCE = REPO_ROOT / "dashboards" / "compose" / "datasources" / "logs.yml"


@dataclass
class Secured:
    url: str
    ca: Path
    secrets_dir: Path
    log: Path

    def password_file(self, user: str) -> Path:
        return self.secrets_dir / MODEL["users"][user]["password_secret"]

    def client(self, user: str | None, password: str | None = None) -> httpx.Client:
        """An HTTPS client trusting the module's CA, logged in as user (its own password unless given)."""
        auth = None
        if user:
            auth = (user, password if password is not None else self.password_file(user).read_text().strip())
        verify = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(base_url=self.url, verify=verify, auth=auth, timeout=30)


def write_passwords(folder: Path) -> None:
    """A random password in each secret file the model names, as `logs make-secrets` makes them."""
    folder.mkdir(mode=0o700)
    names = [u["password_secret"] for u in MODEL["users"].values()] + list(
        MODEL["builtin_passwords"].values()
    )
    for name in names:
        (folder / name).write_text(secrets.token_urlsafe(18) + "\n")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the JVM (not runuser, which would SIGKILL it 2 s later), then the group if need be."""
    for pid in children(process.pid) or [process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def started(process: subprocess.Popen, secured: Secured) -> bool:
    """Ready once the logs admin is answered (503 "Security not initialized" until the plugin has
    loaded its configuration into its index)."""
    if process.poll() is not None:
        tail = secured.log.read_text(errors="replace")[-3000:]
        pytest.fail(f"the secured OpenSearch exited with {process.returncode}:\n{tail}")
    try:
        with secured.client("fleetsight-logs-admin") as http:
            health = http.get("/_cluster/health", params={"wait_for_status": "yellow", "timeout": "1s"})
    except httpx.HTTPError:
        return False
    return health.is_success


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    settings = Settings()
    if not opensearch_install.opensearch_secured_present(settings):
        pytest.fail("OpenSearch with its security plugin is not installed: run `fleetsight setup`")
    # Not under pytest's 0700 tmp folder: OpenSearch runs as nobody when we are root.
    base = Path(tempfile.mkdtemp(prefix="fleetsight-opensearch-secured-"))
    base.chmod(0o755)
    home = opensearch_install.opensearch_secured_home(settings)
    instance, port = base / "node", free_port()
    env = opensearch_install.prepare_opensearch_instance(
        settings, instance, http_port=port, transport_port=free_port(), home=home
    )
    write_passwords(base / "secrets")
    ca = configure_node(instance / "config", base / "secrets", MODEL)
    found = Secured(f"https://127.0.0.1:{port}", ca, base / "secrets", base / "opensearch.log")
    began = time.monotonic()
    with found.log.open("wb") as out:
        process = subprocess.Popen(
            opensearch_install.opensearch_command(settings, home),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_until(lambda: started(process, found), READY_TIMEOUT_S, 0.5, "the secured OpenSearch")
        print(f"secured OpenSearch ready in {time.monotonic() - began:.1f} s")
        yield found
    finally:
        stop(process)
        shutil.rmtree(base, ignore_errors=True)


def document(message: str, node: str = NODE) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {"@timestamp": now, "message": message, "host": {"name": node}, "log": {"level": "error"}}


@dataclass(frozen=True)
class Indexed:
    log_line: str
    audit_line: str


@pytest.fixture(scope="module")
def indexed(secured: Secured) -> Indexed:
    """A kernel line and an audit line, written as Logstash writes them (one _bulk request, as the
    Logstash writer), refreshed at once so that readers see them."""
    lines = Indexed(f"NVRM: Xid 79, GPU has fallen off the bus ({secrets.token_hex(4)})", "sudo: alice")
    actions = [
        {"index": {"_index": LOG_INDEX}},
        document(lines.log_line),
        {"index": {"_index": AUDIT_INDEX}},
        document(lines.audit_line),
    ]
    body = "".join(json.dumps(action) + "\n" for action in actions)
    with secured.client("fleetsight-logstash") as http:
        response = http.post(
            "/_bulk",
            params={"refresh": "true"},
            content=body,
            headers={"Content-Type": "application/x-ndjson"},
        )
    assert response.status_code == 200 and not response.json()["errors"], response.text
    return lines


def search(http: httpx.Client, index: str, phrase: str) -> httpx.Response:
    return http.post(f"/{index}/_search", json={"query": {"match_phrase": {"message": phrase}}})


def messages(response: httpx.Response) -> list[str]:
    return [hit["_source"]["message"] for hit in response.json()["hits"]["hits"]]


# -- the translation (no server) -------------------------------------------------------------------


def test_the_translation_keeps_every_user_and_separates_reading_from_writing(tmp_path: Path) -> None:
    import bcrypt

    write_passwords(tmp_path / "secrets")
    files = security_files(tmp_path / "secrets", MODEL)
    users, roles, mapping = files["internal_users.yml"], files["roles.yml"], files["roles_mapping.yml"]
    for name, user in MODEL["users"].items():
        password = (tmp_path / "secrets" / user["password_secret"]).read_text().strip()
        assert bcrypt.checkpw(password.encode(), users[name]["hash"].replace("$2y$", "$2b$", 1).encode())
        assert all(name in mapping[role]["users"] for role in user["roles"])
    assert mapping["kibana_server"]["users"] == ["kibanaserver"]  # Kibana's kibana_system
    write_groups = {"index", "create_index", "delete", "manage"}
    for name, role in roles.items():
        if name.startswith("_"):
            continue
        for grant in role["index_permissions"]:
            actions = set(grant["allowed_actions"])
            # ElastAlert's own writeback indices are the one place a role both reads and writes.
            if "read" in actions and actions & write_groups:
                assert grant["index_patterns"] == ["elastalert", "elastalert_*"], name
    assert "indices:data/write/bulk" in roles["fleetsight_logstash_writer"]["cluster_permissions"]
    assert roles["fleetsight_logs_admin"]["index_permissions"] == []
    with pytest.raises(SecurityError, match="manage_security"):
        translate_role("too-much", {"cluster": ["manage_security"]})


# -- authentication --------------------------------------------------------------------------------


def test_no_login_a_wrong_password_and_an_unknown_user_are_refused(secured: Secured) -> None:
    with secured.client(None) as http:
        anonymous = http.get("/")
    assert anonymous.status_code == 401
    assert anonymous.headers.get("www-authenticate", "").startswith("Basic")
    with secured.client("fleetsight-reader", password="not-the-password") as http:
        assert http.get("/").status_code == 401
    with secured.client("no-such-user", password="whatever") as http:
        assert http.get("/").status_code == 401


def test_plain_http_and_an_untrusted_server_are_refused(secured: Secured) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(secured.url.replace("https://", "http://") + "/", timeout=10)
    # The system's CAs do not know the module's CA: a client that does not pin it refuses the server.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{secured.url}/", timeout=10)


# -- authorization: each user what its role allows, nothing else ----------------------------------


def test_the_logstash_writer_indexes_but_cannot_read_delete_or_manage(
    secured: Secured, indexed: Indexed
) -> None:
    with secured.client("fleetsight-logstash") as http:
        one = http.post(f"/{LOG_INDEX}/_doc", json=document("a second line", node="n0007"))
        assert one.status_code == 201, one.text
        assert search(http, LOG_INDEX, indexed.log_line).status_code == 403
        assert http.get(f"/{LOG_INDEX}/_doc/{one.json()['_id']}").status_code == 403
        assert http.delete(f"/{LOG_INDEX}/_doc/{one.json()['_id']}").status_code == 403
        assert http.delete(f"/{LOG_INDEX}").status_code == 403
        # Its indices only: not ElastAlert's writeback index, not any other.
        assert http.post("/elastalert_status/_doc", json={"rule_name": "forged"}).status_code == 403
        assert http.post("/other-index/_doc", json={"x": 1}).status_code == 403
        assert http.put("/_ingest/pipeline/sneaky", json={"processors": []}).status_code == 403


def test_the_reader_searches_the_logs_but_not_the_audit_indices(secured: Secured, indexed: Indexed) -> None:
    with secured.client("fleetsight-reader") as http:
        found = search(http, "fleetsight-logs-*", indexed.log_line)
        assert found.status_code == 200, found.text
        assert messages(found) == [indexed.log_line]
        assert http.get("/fleetsight-logs-*/_mapping").status_code == 200  # view_index_metadata
        assert search(http, "fleetsight-audit*", indexed.audit_line).status_code == 403
        assert search(http, AUDIT_INDEX, indexed.audit_line).status_code == 403
        assert http.post(f"/{LOG_INDEX}/_doc", json=document("forged")).status_code == 403
        assert http.delete(f"/{LOG_INDEX}").status_code == 403


def test_the_audit_reader_reads_only_the_audit_indices(secured: Secured, indexed: Indexed) -> None:
    with secured.client(AUDIT_USER) as http:
        found = search(http, "fleetsight-audit*", indexed.audit_line)
        assert found.status_code == 200, found.text
        assert messages(found) == [indexed.audit_line]
        assert search(http, "fleetsight-logs-*", indexed.log_line).status_code == 403
        assert http.post(f"/{AUDIT_INDEX}/_doc", json=document("forged")).status_code == 403


def test_elastalert_reads_the_logs_and_writes_only_its_own_indices(
    secured: Secured, indexed: Indexed
) -> None:
    with secured.client("fleetsight-elastalert") as http:
        assert messages(search(http, "fleetsight-logs-*", indexed.log_line)) == [indexed.log_line]
        assert http.post("/elastalert_status/_doc", json={"rule_name": "xid"}).status_code == 201
        assert search(http, AUDIT_INDEX, indexed.audit_line).status_code == 403
        assert http.post(f"/{LOG_INDEX}/_doc", json=document("forged")).status_code == 403


def test_the_logs_admin_manages_pipelines_and_templates_but_reads_no_document(
    secured: Secured, indexed: Indexed
) -> None:
    with secured.client("fleetsight-logs-admin") as http:
        pipeline = {"processors": [{"set": {"field": "event.kind", "value": "event"}}]}
        assert http.put("/_ingest/pipeline/fleetsight-test", json=pipeline).status_code == 200
        template = {
            "index_patterns": ["fleetsight-test-*"],
            "template": {"settings": {"number_of_replicas": 0}},
        }
        assert http.put("/_index_template/fleetsight-test", json=template).status_code == 200
        assert search(http, LOG_INDEX, indexed.log_line).status_code == 403
        assert http.post(f"/{LOG_INDEX}/_doc", json=document("forged")).status_code == 403
        assert http.delete(f"/{LOG_INDEX}").status_code == 403


# -- FleetSight's own clients ----------------------------------------------------------------------


def test_logs_apply_runs_as_the_logs_admin(secured: Secured) -> None:
    env = {
        **os.environ,
        "FLEETSIGHT_LOGS_USERNAME": "fleetsight-logs-admin",
        "FLEETSIGHT_LOGS_PASSWORD_FILE": str(secured.password_file("fleetsight-logs-admin")),
        "FLEETSIGHT_LOGS_CA_FILE": str(secured.ca),
        "COLUMNS": "200",
    }
    command = [sys.executable, "-m", "fleetsight.cli", "logs", "apply", "--skip-kafka", "--url", secured.url]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fleetsight-logs" in done.stdout and "created" in done.stdout, done.stdout
    with secured.client("fleetsight-logs-admin") as http:
        for log_class in LOG_CLASSES:
            assert http.get(f"/_ingest/pipeline/{log_class.pipeline_id}").status_code == 200
        assert http.get("/_index_template/fleetsight-logs").status_code == 200
    # Without the credential the same command is refused, and says so.
    bare = {k: v for k, v in env.items() if not k.startswith("FLEETSIGHT_LOGS_")}
    refused = subprocess.run(command, env=bare, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert refused.returncode != 0


def test_the_chatbot_finds_the_writers_line_as_the_reader(
    secured: Secured, indexed: Indexed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_USER", "fleetsight-reader")
    monkeypatch.setenv(
        "FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE", str(secured.password_file("fleetsight-reader"))
    )
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_CA_FILE", str(secured.ca))
    context = gather(f"why did my job on {NODE} crash?", chat_config(logs_url=secured.url).live)
    assert context.failed == [], context.notes
    assert [e.summary for e in context.evidence] == [f"{NODE}: {indexed.log_line}"], context.notes


def secret_path(value: str, run_secrets: Path) -> Path:
    """A provisioning value `$__file{/run/secrets/NAME}` (Grafana reads the file) as this module's file."""
    assert value.startswith("$__file{/run/secrets/") and value.endswith("}"), value
    return run_secrets / value.removeprefix("$__file{/run/secrets/").removesuffix("}")


def test_the_logs_datasource_of_compose_logs_in_as_the_reader(
    secured: Secured, indexed: Indexed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The logs datasource file docker-compose.yml provisions into Grafana: its user, its password and CA
    secrets (the Docker secrets' folder is this module's) and its index pattern, presented by the project's
    own client (pipelines' SearchServer, TLS checked against the CA) to the secured OpenSearch: the reader
    searches the logs and is refused the audit indices; the file's password is the one presented."""
    source = yaml.safe_load(COMPOSE_LOGS_DATASOURCE.read_text())["datasources"][0]
    run_secrets = tmp_path / "secrets"
    run_secrets.mkdir()
    shutil.copy(secured.password_file("fleetsight-reader"), run_secrets / "es-reader-password")
    shutil.copy(secured.ca, run_secrets / "elasticsearch-ca.pem")
    assert source["basicAuth"] is True and source["jsonData"]["tlsAuthWithCACert"] is True
    monkeypatch.setenv("FLEETSIGHT_LOGS_USERNAME", source["basicAuthUser"])
    password = secret_path(source["secureJsonData"]["basicAuthPassword"], run_secrets)
    monkeypatch.setenv("FLEETSIGHT_LOGS_PASSWORD_FILE", str(password))
    monkeypatch.setenv(
        "FLEETSIGHT_LOGS_CA_FILE", str(secret_path(source["secureJsonData"]["tlsCACert"], run_secrets))
    )
    server = SearchServer(secured.url)
    index = source["jsonData"]["index"]
    found = server.request(
        "POST", f"/{index}/_search", {"query": {"match_phrase": {"message": indexed.log_line}}}
    )
    assert messages(found) == [indexed.log_line]
    with pytest.raises(ApplyError, match="HTTP 403"):
        server.request("GET", f"/{AUDIT_INDEX}/_search")
    # a wrong password in the secret is refused: the login above was the file's, not a default
    password.write_text("not-the-reader-password\n")
    with pytest.raises(ApplyError, match="HTTP 401"):
        SearchServer(secured.url).request("POST", f"/{index}/_search", {"size": 0})
