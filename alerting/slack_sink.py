"""A stand-in for Slack's incoming-webhook endpoint, for the local stack and the tests.

Slack cannot be reached from here, so Alertmanager's ``slack_configs`` post to this server instead.
It answers as Slack does (``200 ok``) and appends every message to a JSON-lines file, so that a test
or an operator can see exactly what would have reached the channel.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_handler(record_file: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            try:
                payload = json.loads(body)
            except json.JSONDecodeError:
                self.send_response(400)
                self.end_headers()
                self.wfile.write(b"invalid_payload")
                return
            with record_file.open("a") as out:
                out.write(
                    json.dumps({"received_at": time.time(), "path": self.path, "payload": payload}) + "\n"
                )
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")

        def do_GET(self) -> None:  # readiness and a look at what arrived
            lines = record_file.read_text().splitlines() if record_file.exists() else []
            body = json.dumps({"messages": len(lines)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"event=http {fmt % args}", flush=True)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Record Slack webhook posts to a JSON-lines file.")
    parser.add_argument("--listen", default="127.0.0.1:19095", help="host:port to listen on")
    parser.add_argument("--record", type=Path, required=True, help="JSON-lines file to append messages to")
    args = parser.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    args.record.parent.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((host, int(port)), make_handler(args.record))
    print(f"event=listening address={args.listen} record={args.record}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
