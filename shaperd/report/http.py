"""The daemon's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz``: the process is alive and its loop ticks (liveness probe).
``/readyz``: a tenants file is loaded and the last reconcile succeeded
(readiness probe). Both answer 200 or 503 with a one-line reason. Served
from a daemon thread; a scrape never touches the kernel (collectors read
snapshots).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.exposition import CONTENT_TYPE_LATEST


def parse_address(addr: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' (all interfaces) or '[V6]:PORT' -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-address {addr!r}: expected HOST:PORT, :PORT or [IPv6]:PORT")
    host = host.strip("[]")
    return host, int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, handler, metrics):
        import socket

        self.metrics = metrics
        if ":" in addr[0] or addr[0] == "":
            self.address_family = socket.AF_INET6  # "" binds [::] (dual-stack where allowed)
            addr = (addr[0] or "::", addr[1])
        super().__init__(addr, handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        m = self.server.metrics
        if path == "/metrics":
            self._send(200, m.exposition(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok, why = m.healthy()
            self._send(200 if ok else 503, f"{'ok' if ok else 'unhealthy'}: {why}\n".encode())
        elif path == "/readyz":
            ok, why = m.ready()
            self._send(200 if ok else 503, f"{'ready' if ok else 'not ready'}: {why}\n".encode())
        else:
            self._send(404, b"try /metrics, /healthz or /readyz\n")

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:  # scrapes are not log news
        pass


class MetricsServer:
    def __init__(self, address: str, metrics):
        host, port = parse_address(address)
        try:
            self.httpd = _Server((host, port), _Handler, metrics)
        except OSError:
            if host:
                raise
            # ":PORT" on a node without IPv6: all IPv4 interfaces instead.
            self.httpd = _Server(("0.0.0.0", port), _Handler, metrics)
        self.address = self.httpd.server_address
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="shaperd-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
