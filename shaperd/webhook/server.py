"""The webhook's HTTPS server: ``POST /mutate`` (AdmissionReview), ``GET /healthz`` and ``/readyz``.

stdlib ``http.server`` + ``ssl``: the API server sends one small JSON request
at a time per connection, which needs no framework, and the stdlib keeps the
image free of another TLS stack. Each accepted connection is wrapped with the
certificate current at that moment (reload.TlsFiles), and its TLS handshake
runs on the connection's own thread, so a slow client never holds up accept
(the listening and the set-up: report/listen.py).
Every read has a deadline: the socket timeout for the handshake and the
headers, one overall deadline for the body. A review that cannot be answered
as asked is answered "allowed, no patch" (failurePolicy Ignore semantics);
nothing a client sends ends the server.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler

from shaperd.core import log
from shaperd.report import listen
from shaperd.webhook import admission

# An AdmissionReview of a CREATE carries one object; the API server caps objects at about 3 MiB.
MAX_BODY_BYTES = 6 * 1024 * 1024
DEFAULT_READ_TIMEOUT_S = 10.0  # the API server's webhook timeout is at most 30 s (we ask for 5)


class _Server(listen.ThreadedServer):
    def __init__(self, host: str, port: int, tls, tenants, read_timeout_s: float):
        self.tls, self.tenants, self.read_timeout_s = tls, tenants, read_timeout_s
        self.client_timeout_s = read_timeout_s
        self.log = log.get("shaperd.webhook")
        super().__init__(host, port, _Handler)

    def connection_tls(self):
        ctx = self.tls.context()  # the certificate on disk now (or the last good one)
        if ctx is None:  # TlsFiles refuses to start without one; never served as plain HTTP
            raise ssl.SSLError("no TLS certificate loaded")
        return ctx, None

    def handshake_failed(self, client_address, error: OSError) -> None:
        self._failed(client_address, error)

    def handle_error(self, request, client_address) -> None:
        # A client gone mid-request: one line, never a traceback on stderr.
        self._failed(client_address, sys.exc_info()[1])

    def _failed(self, client_address, e) -> None:
        self.log.info("connection failed", client=client_address[0], error=f"{type(e).__name__}: {e}")

    def review(self, body: bytes) -> admission.Verdict:
        try:
            mutator = self.tenants.current()
            if mutator is None:
                v = admission.allow(body, "no valid tenants file loaded yet", malformed=False)
            else:
                v = mutator.review(body)
        except Exception:  # noqa: BLE001 - a bug answers "allowed, no patch", never a dead server
            self.log.exception("review failed with an internal error; allowed without a patch")
            v = admission.allow(body, "internal error")
        fields = dict(uid=v.uid, pod=v.pod or None, tenant=v.tenant)
        if v.malformed:
            self.log.warning("malformed review allowed without a patch", reason=v.why, **fields)
        elif v.tenant is not None:
            self.log.info("pod mutated" if v.patched else "pod of a tenant left as it is", added=v.added,
                          kept_the_pods_own=v.kept or None, skipped_env_from=list(v.skipped) or None,
                          reason=v.why or None, **fields)
        else:
            self.log.debug("pod not mutated", reason=v.why, **fields)
        return v


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # the API server keeps connections open between reviews

    def do_POST(self):  # noqa: N802 - http.server's naming
        if self.path.split("?", 1)[0] != "/mutate":
            self.close_connection = True  # its body is not read: the connection cannot carry another request
            return self._send(404, b"POST AdmissionReviews to /mutate\n")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            return self._send(411, b"Content-Length required\n")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            return self._send(413, f"body over {MAX_BODY_BYTES} bytes\n".encode())
        body = self._body(int(length))
        if body is None:
            return
        v = self.server.review(body)
        self._send(200, json.dumps(v.response).encode(), "application/json")

    def do_GET(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ok = self.server.tenants.current() is not None
            self._send(200 if ok else 503, b"ready\n" if ok else b"not ready: no valid tenants file\n")
        else:
            self._send(404, b"try POST /mutate, GET /healthz or /readyz\n")

    def _body(self, n: int) -> bytes | None:
        """Read n bytes within one deadline (a per-read timeout alone lets a trickle last forever)."""
        deadline = time.monotonic() + self.server.read_timeout_s
        data = bytearray()
        try:
            while len(data) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(n - len(data), 1 << 16))
                if not chunk:
                    raise ConnectionError("client closed the connection")
                data += chunk
        except (TimeoutError, ConnectionError, OSError) as e:
            self.server.log.info("request body not received", client=self.client_address[0], expected=n,
                                 received=len(data), error=type(e).__name__)
            self.close_connection = True
            return None
        finally:
            self.connection.settimeout(self.server.read_timeout_s)
        return bytes(data)

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:
        self.server.log.debug("http", client=self.client_address[0], message=fmt % args)

    def log_error(self, fmt, *args) -> None:  # bad request lines; an idle kept-alive connection timing out
        level = self.server.log.debug if fmt.startswith("Request timed out") else self.server.log.info
        level("http request failed", client=self.client_address[0], message=fmt % args)


class WebhookServer:
    def __init__(self, address: str, tls, tenants, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        host, port = listen.parse_address(address, "--address")
        self.httpd = listen.bind(lambda h, p: _Server(h, p, tls, tenants, read_timeout_s), host, port)
        self.address = self.httpd.server_address[:2]

    def start(self) -> None:
        # serve_forever notices shutdown() within one poll interval.
        self.httpd.serve_in_thread("shaperd-webhook", poll_interval_s=0.1)

    def stop(self) -> None:
        self.httpd.stop()
