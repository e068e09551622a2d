"""The one HTTP server both exporters answer scrapes with.

A page function maps a request path to a :class:`Page` (or None: 404). Metrics pages are gzipped when
the scraper asks for it (Prometheus does), unless the page brings its own gzipped bytes (the fabric
exporter's cached snapshot). The server runs on a daemon thread; ``shutdown()`` stops it.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetsight.webconfig import WebConfig

GZIP_MIN_BYTES = 1024  # below this, compressing costs more than it saves


@dataclass(frozen=True)
class Page:
    body: bytes
    content_type: str = CONTENT_TYPE_LATEST
    status: int = 200
    gzipped: bytes | None = None  # the body, already compressed


def metrics_page(text: bytes, gzipped: bytes | None = None) -> Page:
    return Page(text, CONTENT_TYPE_LATEST, 200, gzipped)


def html_page(html: str) -> Page:
    return Page(html.encode(), "text/html; charset=utf-8")


def json_page(text: str) -> Page:
    return Page(text.encode(), "application/json")


def not_found(detail: str = "not found") -> Page:
    return Page(f"{detail}\n".encode(), "text/plain; charset=utf-8", 404)


def parse_listen(listen: str) -> tuple[str, int]:
    """``("0.0.0.0", 9401)`` from ``:9401``, ``0.0.0.0:9401`` or ``[::1]:9401``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(
    listen: str, pages: Callable[[str], Page | None], web: WebConfig | None = None
) -> ThreadingHTTPServer:
    """Starts answering GET requests on ``listen`` (HOST:PORT) from ``pages``; returns the server. With a
    web configuration: TLS on the socket, and basic auth on every request."""
    web = web or WebConfig()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that opens a connection and sends nothing is dropped

        def do_GET(self) -> None:
            if not web.authorized(self.headers.get("Authorization")):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="fleetsight"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path = self.path.split("?", 1)[0]
            try:
                page = pages(path) or not_found()
            except Exception as exc:  # a bug behind one page must not take the server down
                page = Page(f"error: {exc!r}\n".encode(), "text/plain; charset=utf-8", 500)
            body, encoding = page.body, ""
            wants_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
            if wants_gzip and page.status == 200 and page.content_type == CONTENT_TYPE_LATEST:
                if page.gzipped is not None:
                    body, encoding = page.gzipped, "gzip"
                elif len(body) >= GZIP_MIN_BYTES:
                    body, encoding = gzip.compress(body, compresslevel=1), "gzip"
            self.send_response(page.status)
            self.send_header("Content-Type", page.content_type)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would drown the agent's own log

    host, port = parse_listen(listen)
    server = ThreadingHTTPServer((host, port), Handler)
    if web.tls is not None:
        # handshakes happen in the request threads (not in accept), so one slow client blocks no one
        server.socket = web.tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
