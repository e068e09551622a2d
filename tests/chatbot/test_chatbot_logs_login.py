"""The chatbot's log search against an Elasticsearch with security on (docker-compose.yml): over TLS with
the stack's private CA, logged in as the read-only user. No Elasticsearch with security can run here (the
local OpenSearch runs without its security plugin), so a small HTTPS server stands in for it: it checks
basic auth as Elasticsearch does (401 with ``WWW-Authenticate``) and answers ``_search`` in its format."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatbot.config import ConfigError, chat_config
from chatbot.live import gather
from support import free_port

USER, PASSWORD = "fleetsight-reader", "reader-pw-5d0c1f"
NODE = "n0042"


class SearchHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.answer(401, {"error": {"type": "security_exception"}, "status": 401})
            return
        if not self.path.split("?")[0].endswith("/_search") or NODE not in body.decode():
            self.answer(400, {"error": {"type": "parsing_exception"}, "status": 400})
            return
        hit = {"_source": {"@timestamp": "2026-11-25T10:00:00Z", "message": "NVRM: Xid 79 fell off the bus"}}
        self.answer(200, {"hits": {"total": {"value": 1}, "hits": [hit]}})

    def answer(self, status: int, document: dict) -> None:
        payload = json.dumps(document).encode()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="security"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def secured_search(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The server's URL and the CA file that verifies it (a self-signed certificate for 127.0.0.1)."""
    folder = tmp_path_factory.mktemp("es-tls")
    cert, key = folder / "es.pem", folder / "es.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), SearchHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


def login_env(monkeypatch: pytest.MonkeyPatch, folder: Path, password: str, ca: Path) -> None:
    secret = folder / "es-reader-password"
    secret.write_text(password + "\n")
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_USER", USER)
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_CA_FILE", str(ca))


def test_the_log_search_logs_in_over_tls_with_the_private_ca(
    secured_search: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, ca = secured_search
    login_env(monkeypatch, tmp_path, PASSWORD, ca)
    sources = chat_config(logs_url=url).live
    assert PASSWORD not in repr(sources)
    context = gather(f"why did my job on {NODE} crash?", sources)
    assert [e.summary for e in context.evidence] == [f"{NODE}: NVRM: Xid 79 fell off the bus"], context.notes
    assert context.failed == []


def test_a_refused_login_is_said_and_the_answer_goes_on(
    secured_search: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, ca = secured_search
    login_env(monkeypatch, tmp_path, "not-the-password", ca)
    context = gather(f"why did my job on {NODE} crash?", chat_config(logs_url=url).live)
    assert context.evidence == []
    assert any("refused the chatbot's login (HTTP 401)" in note for note in context.notes), context.notes


def test_without_the_ca_the_server_is_not_trusted(
    secured_search: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, _ = secured_search
    login_env(monkeypatch, tmp_path, PASSWORD, Path("/dev/null"))
    monkeypatch.delenv("FLEETSIGHT_CHATBOT_LOGS_CA_FILE")
    context = gather(f"why did my job on {NODE} crash?", chat_config(logs_url=url).live)
    assert context.evidence == [] and context.failed, context.notes


def test_a_user_without_a_password_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_USER", USER)
    monkeypatch.delenv("FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE", raising=False)
    with pytest.raises(ConfigError, match="FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE must name"):
        chat_config(logs_url="https://127.0.0.1:1")
    monkeypatch.setenv("FLEETSIGHT_CHATBOT_LOGS_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="cannot read"):
        chat_config(logs_url="https://127.0.0.1:1")
