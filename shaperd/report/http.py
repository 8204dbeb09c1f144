"""The daemon's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

``/healthz``: the process is alive and its loop ticks (liveness probe).
``/readyz``: a tenants file is loaded and the last reconcile succeeded
(readiness probe). Both answer 200 or 503 with a one-line reason; on a
degraded node (report/degraded.py) both stay 200 and the reason carries the
"degraded: ..." line (report/health.py says why). Served
from a daemon thread; a scrape never touches the kernel (collectors read
snapshots).

Read-only by construction: GET is the only method served; every other
method (HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE, CONNECT or an
invented one) is answered 405 with ``Allow: GET``, an unknown path 404, and
no handler writes anything. With a web config file (``--web.config.file``,
report/webconfig.py): TLS on the connection, and basic auth on /metrics
(/healthz and /readyz stay open: the kubelet's probes carry no credentials,
and they answer one line). A client gets ``CLIENT_TIMEOUT_S`` per read, so a
stalled connection cannot keep a thread forever. Where it listens and how
each connection is set up (TLS on its own thread): report/listen.py.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shaperd.core import log
from shaperd.report import listen

CLIENT_TIMEOUT_S = 10.0
PROBE_PATHS = ("/healthz", "/readyz")


class _Server(listen.ThreadedServer):
    client_timeout_s = CLIENT_TIMEOUT_S

    def __init__(self, host: str, port: int, metrics, web=None):
        self.metrics = metrics
        self.web = web  # report.webconfig.WebConfigSource, or None: plain HTTP, no auth
        super().__init__(host, port, _Handler)

    def connection_tls(self):
        """The web config now, and its TLS context (None: plain HTTP)."""
        web, ctx = self.web.current() if self.web is not None else (None, None)
        return ctx, web

    def handle_connection(self, conn, client_address, web) -> None:
        self.RequestHandlerClass(conn, client_address, self, web)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT_S

    def __init__(self, request, client_address, server, web=None):
        self.web = web
        super().__init__(request, client_address, server)

    def __getattr__(self, name: str):
        # http.server looks up do_<METHOD>; every method but GET is refused the same way.
        if name.startswith("do_"):
            return self._refuse_method
        raise AttributeError(name)

    def _refuse_method(self) -> None:
        self._send(405, b"read-only endpoint: only GET is served\n", extra={"Allow": "GET"})

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        m = self.server.metrics
        if self.web is not None and path not in PROBE_PATHS and not self.web.check_authorization(
                self.headers.get("Authorization")):
            self._send(401, b"unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="shaperd"'})
            return
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

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8", extra=None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in {**(self.web.headers if self.web is not None else {}), **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:  # scrapes are not log news
        pass


class MetricsServer:
    def __init__(self, address: str, metrics, web_config_file: str | None = None):
        host, port = listen.parse_address(address, "--metrics-address")
        web = None
        if web_config_file:
            from shaperd.report.webconfig import WebConfigSource

            lg = log.get("shaperd.http")
            web = WebConfigSource(web_config_file, on_error=lambda e: lg.error(
                "web config rejected; keeping the last good one", error=str(e)))
        self.scheme = "https" if web is not None and web.config.tls is not None else "http"
        self.httpd = listen.bind(lambda h, p: _Server(h, p, metrics, web), host, port)
        self.address = self.httpd.server_address

    def start(self) -> None:
        self.httpd.serve_in_thread("shaperd-http")

    def stop(self) -> None:
        self.httpd.stop()
