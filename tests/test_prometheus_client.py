"""The core's Prometheus client (fleetsight/prometheus.py) against a small HTTP server on loopback that
answers with the shapes of Prometheus's HTTP API (success vectors and matrices, error answers with an
errorType, a proxy's 503, an answer that never comes), and against a real Prometheus."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetsight.prometheus import (
    ANY_VALUE,
    DIGITS,
    Columns,
    Prometheus,
    PrometheusBadAnswer,
    PrometheusError,
    PrometheusHTTPError,
    PrometheusQueryError,
    PrometheusTimeout,
    PrometheusUnreachable,
)
from fleetsight.secrets import SecretFileError
from support import free_port, prometheus_server, self_signed

# An answer: (HTTP status, content type, body).
Answer = tuple[int, str, bytes]


def success(data: Any, compact: bool = True) -> Answer:
    """A success answer, written as Prometheus writes it (UTF-8, no spaces) or, not ``compact``, spaced."""
    separators = (",", ":") if compact else None
    body = json.dumps({"status": "success", "data": data}, separators=separators, ensure_ascii=not compact)
    return 200, "application/json", body.encode()


def error(status: int, error_type: str, message: str) -> Answer:
    body = {"status": "error", "errorType": error_type, "error": message}
    return status, "application/json", json.dumps(body).encode()


def vector(*samples: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {"resultType": "vector", "result": [{"metric": m, "value": [1.8e9, v]} for m, v in samples]}


@dataclass
class Seen:
    """One request as the server got it."""

    method: str
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class FakeAPI:
    """What the loopback server answers per path, and every request it got."""

    answers: dict[str, Answer | Callable[[], Answer]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.answer(parse_qs(urlsplit(self.path).query))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self.answer(parse_qs(self.rfile.read(length).decode()))

            def answer(self, params: dict[str, list[str]]) -> None:
                path = urlsplit(self.path).path
                api.seen.append(
                    Seen(self.command, path, params, {k.lower(): v for k, v in self.headers.items()})
                )
                found = api.answers.get(path, (404, "text/plain", b"404 page not found\n"))
                status, kind, body = found() if callable(found) else found
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (the timeout, the refused certificate) is what some tests are about."""


@contextlib.contextmanager
def serve(api: FakeAPI, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """The fake API on a free loopback port (HTTPS with ``tls``: certificate, key); its URL."""
    server = QuietServer(("127.0.0.1", 0), api.handler())
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*map(str, tls))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        api.release.set()  # a handler held open for a timeout ends before the server does
        server.shutdown()
        server.server_close()


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI()


@pytest.fixture
def url(api: FakeAPI) -> Iterator[str]:
    with serve(api) as address:
        yield address


def test_an_instant_query_is_a_get_with_its_time_and_gives_the_vector(api: FakeAPI, url: str) -> None:
    api.answers["/api/v1/query"] = success(vector(({"node": "n1"}, "1")))
    with Prometheus(url + "/", headers={"Accept-Encoding": "identity"}) as prom:
        assert prom.query("up", 1.8e9) == [{"metric": {"node": "n1"}, "value": [1.8e9, "1"]}]
        prom.query("up", "2026-11-28T16:00:00Z")
    first, second = api.seen
    assert (first.method, first.params) == ("GET", {"query": ["up"], "time": ["1800000000.0"]})
    assert first.headers["accept-encoding"] == "identity"
    assert second.params["time"] == ["2026-11-28T16:00:00Z"]


def test_long_queries_go_as_a_post_form(api: FakeAPI, url: str) -> None:
    api.answers["/api/v1/query"] = success(vector())
    api.answers["/api/v1/query_range"] = success({"resultType": "matrix", "result": []})
    with Prometheus(url, post_over=10) as prom:
        prom.query("up")
        prom.query('up{node=~"n1|n2|n3"}')
    assert [(s.method, s.params["query"]) for s in api.seen] == [
        ("GET", ["up"]),
        ("POST", ['up{node=~"n1|n2|n3"}']),
    ]
    with Prometheus(url, post_over=0) as prom:
        prom.query_range("up", 1, 2, "15s")
    assert api.seen[-1].method == "POST"
    assert api.seen[-1].params == {"query": ["up"], "start": ["1"], "end": ["2"], "step": ["15s"]}


def test_a_range_query_gives_the_matrix_and_refuses_another_type(api: FakeAPI, url: str) -> None:
    matrix = {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "2"], [16, "3"]]}]}
    api.answers["/api/v1/query_range"] = success(matrix)
    api.answers["/api/v1/query"] = success({"resultType": "scalar", "result": [1.8e9, "4"]})
    with Prometheus(url) as prom:
        assert prom.query_range("up", 1.0, 16.0, 15) == matrix["result"]
        assert prom.query_data("scalar(up)")["result"] == [1.8e9, "4"]
        with pytest.raises(PrometheusBadAnswer, match="expected a vector, got scalar"):
            prom.query("scalar(up)")


def test_prometheus_error_answers_carry_their_type_whatever_the_status(api: FakeAPI, url: str) -> None:
    with Prometheus(url) as prom:
        for status, kind in ((400, "bad_data"), (422, "execution"), (503, "unavailable")):
            api.answers["/api/v1/query"] = error(status, kind, f"{kind} happened")
            with pytest.raises(PrometheusQueryError) as caught:
                prom.query("up")
            assert (caught.value.status, caught.value.error_type, caught.value.error) == (
                status,
                kind,
                f"{kind} happened",
            )
            assert url in str(caught.value) and kind in str(caught.value)


def test_an_answer_that_is_not_prometheus_is_an_http_error_or_a_bad_answer(api: FakeAPI, url: str) -> None:
    with Prometheus(url) as prom:
        api.answers["/api/v1/query"] = (503, "text/html", b"<html>upstream gone</html>")
        with pytest.raises(PrometheusHTTPError, match="HTTP 503: <html>upstream gone") as caught:
            prom.query("up")
        assert caught.value.status == 503
        with pytest.raises(PrometheusHTTPError, match="HTTP 404"):
            prom.alerts()  # no path answers but the query
        api.answers["/api/v1/query"] = (200, "application/json", b'{"status":"success","data":')
        with pytest.raises(PrometheusBadAnswer, match="not an API answer"):
            prom.query("up")
        api.answers["/api/v1/query"] = (200, "application/json", b'["a", "list"]')
        with pytest.raises(PrometheusBadAnswer):
            prom.query("up")


def test_no_answer_is_unreachable_and_a_slow_one_a_timeout(api: FakeAPI, url: str) -> None:
    with Prometheus(f"http://127.0.0.1:{free_port()}") as prom:
        with pytest.raises(PrometheusUnreachable) as caught:
            prom.query("up")
        assert not isinstance(caught.value, PrometheusTimeout)
        assert not prom.ready()

    def held() -> Answer:
        api.release.wait(30)
        return success(vector())

    api.answers["/api/v1/query"] = held
    with Prometheus(url, timeout=0.3) as prom, pytest.raises(PrometheusTimeout, match="ReadTimeout"):
        prom.query("up")
    api.release.set()
    assert issubclass(PrometheusTimeout, PrometheusUnreachable)
    assert issubclass(PrometheusUnreachable, PrometheusError)


def test_series_labels_rules_alerts_and_readiness(api: FakeAPI, url: str) -> None:
    api.answers["/api/v1/series"] = success([{"__name__": "up", "node": "n1"}])
    api.answers["/api/v1/label/node/values"] = success(["n1", "n2"])
    api.answers["/api/v1/rules"] = success({"groups": [{"name": "g", "rules": []}]})
    api.answers["/api/v1/alerts"] = success({"alerts": [{"labels": {"alertname": "A"}}]})
    api.answers["/-/ready"] = (200, "text/plain", b"Prometheus Server is Ready.\n")
    with Prometheus(url) as prom:
        assert prom.series("up", "DCGM_FI_DEV_GPU_UTIL", start=1, end=2) == [{"__name__": "up", "node": "n1"}]
        assert prom.label_values("node", "up", start=1.5) == ["n1", "n2"]
        assert prom.label_values("node") == ["n1", "n2"]
        assert prom.rules("alert") == [{"name": "g", "rules": []}]
        assert prom.alerts() == [{"labels": {"alertname": "A"}}]
        assert prom.ready()
    series, labels, labels_all, rules = (s.params for s in api.seen[:4])
    assert series == {"match[]": ["up", "DCGM_FI_DEV_GPU_UTIL"], "start": ["1"], "end": ["2"]}
    assert labels == {"match[]": ["up"], "start": ["1.5"]} and labels_all == {}
    assert rules == {"type": ["alert"]}


def test_credentials_from_files_are_sent(api: FakeAPI, url: str, tmp_path: Path) -> None:
    api.answers["/api/v1/query"] = success(vector())
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "password").write_text("pa55\n")
    with Prometheus(url, bearer_token_file=tmp_path / "token") as prom:
        prom.query("up")
    with Prometheus(url, username="reader", password_file=tmp_path / "password") as prom:
        prom.query("up")
    assert api.seen[0].headers["authorization"] == "Bearer s3cret-token"
    assert api.seen[1].headers["authorization"] == "Basic cmVhZGVyOnBhNTU="  # reader:pa55
    with pytest.raises(SecretFileError, match="missing"):
        Prometheus(url, bearer_token_file=tmp_path / "missing")


def test_tls_takes_a_ca_file_or_no_verification(api: FakeAPI, tmp_path: Path) -> None:
    api.answers["/api/v1/query"] = success(vector())
    cert, key = self_signed(tmp_path, "prometheus")
    with serve(api, (cert, key)) as url:
        with Prometheus(url, ca_file=cert) as prom:
            assert prom.query("up") == []
        with Prometheus(url, verify=False) as prom:
            assert prom.query("up") == []
        with Prometheus(url) as prom, pytest.raises(PrometheusUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            prom.query("up")


def test_a_compact_vector_is_read_as_columns_and_any_other_as_samples(api: FakeAPI, url: str) -> None:
    samples = (({"gpu": "0", "node": "nö1"}, "0.5"), ({"gpu": "7", "node": "n2"}, "NaN"))
    per_gpu = {"gpu": DIGITS, "node": ANY_VALUE}
    with Prometheus(url) as prom:
        api.answers["/api/v1/query"] = success(vector(*samples))
        columns = prom.query_columns("x", per_gpu, 1.8e9)
        assert isinstance(columns, Columns) and len(columns) == 2
        assert columns.strings("node") == ["nö1", "n2"] and columns.labels["gpu"] == (b"0", b"7")
        assert columns.values == (b"0.5", b"NaN")
        assert prom.query_columns("x", {"node": ANY_VALUE}) == vector(*samples)["result"]  # a label more
        api.answers["/api/v1/query"] = success(vector(*samples), compact=False)
        assert prom.query_columns("x", per_gpu) == vector(*samples)["result"]
        api.answers["/api/v1/query"] = success(vector(({"gpu": "a", "node": "n1"}, "1")))
        assert isinstance(prom.query_columns("x", per_gpu), list)  # not digits
        api.answers["/api/v1/query"] = success(vector())
        assert prom.query_columns("x", per_gpu) == Columns({"gpu": (), "node": ()}, ())
        api.answers["/api/v1/query"] = error(422, "execution", "too many samples")
        with pytest.raises(PrometheusQueryError, match="too many samples"):
            prom.query_columns("x", per_gpu)


def test_against_a_real_prometheus(tmp_path: Path) -> None:
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    with prometheus_server(tmp_path, config) as url, Prometheus(url) as prom:
        assert prom.ready()
        assert prom.query("vector(1)", 1.8e9) == [{"metric": {}, "value": [1.8e9, "1"]}]
        labelled = 'label_replace(label_replace(vector(7), "node", "n1", "", ""), "gpu", "3", "", "")'
        columns = prom.query_columns(labelled, {"gpu": DIGITS, "node": ANY_VALUE})
        assert columns == Columns({"gpu": (b"3",), "node": (b"n1",)}, (b"7",))  # Prometheus's own form
        assert len(prom.query_range("vector(1)", 1.8e9, 1.8e9 + 60, 15)[0]["values"]) == 5
        with pytest.raises(PrometheusQueryError) as caught:
            prom.query("sum(")
        assert (caught.value.status, caught.value.error_type) == (400, "bad_data")
        assert prom.rules() == [] and prom.alerts() == []
        assert isinstance(prom.label_values("__name__"), list)
