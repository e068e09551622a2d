"""Loopback links the game day can cut: a TCP proxy in front of a server, on a port of its own, that the
game day's stack is told to use instead of the server's own (the health service's Prometheus and
Alertmanager, whose URLs the game day sets). Cut, it drops every open connection and refuses new ones
(a link down, a firewall change); slowed, it holds each chunk for a while (a congested or flapping link).

A proxy per link, each a listening thread and two pump threads per connection: loopback only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

CHUNK = 65536
CONNECT_TIMEOUT_S = 5.0


class LinkProxy:
    """Forwards 127.0.0.1:<port> to ``target`` (host, port) while open."""

    def __init__(self, name: str, target: tuple[str, int]) -> None:
        self.name = name
        self.target = target
        self.cut = threading.Event()
        self.delay_s = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, name=f"link-{name}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_for(self, seconds: float, stopping: threading.Event) -> None:
        """Drop the link for ``seconds`` (or until ``stopping``), then restore it."""
        self.cut.set()
        self._drop_all()
        stopping.wait(seconds)
        self.cut.clear()

    def slow_for(self, delay_s: float, seconds: float, stopping: threading.Event) -> None:
        self.delay_s = delay_s
        stopping.wait(seconds)
        self.delay_s = 0.0

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self._drop_all()

    # ------------------------------------------------------------------ the forwarding
    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()  # a cut link: the connection is refused as soon as it is made
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        with self.lock:
            self.connections.update((client, server))
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self.cut.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                if self.delay_s:
                    time.sleep(self.delay_s)  # the slowed link's latency: the experiment itself
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(source, sink)

    def _forget(self, *sockets: socket.socket) -> None:
        with self.lock:
            for sock in sockets:
                self.connections.discard(sock)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _drop_all(self) -> None:
        with self.lock:
            sockets = list(self.connections)
        self._forget(*sockets)
