"""HTTP to the API server: one urllib3 pool per watcher, TLS from a ``ClientConfig``; GETs, and the one
write the agent makes (``patch_json``: the startup taint's JSON patch of its own node).

Owns the request: URL (server prefix + path + query), the TLS context (the
cluster CA or the system roots, a client certificate, insecure-skip-tls-verify,
tls-server-name), the bearer token of the moment (``auth``), connect and read
timeouts on every request, no urllib3 retries (the watch loops back off
themselves), TCP keepalive (a dead peer under a quiet watch is noticed), and
turning a non-2xx answer into ``ApiStatus`` (its Status message read, bounded).
A 401 invalidates the cached credential so the next attempt reads/runs it again.

Must not: retry, log, or map errors to the watch loops' classes
(``errors.map_api_error`` does, once, in the caller).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import tempfile
import threading
from urllib.parse import urlencode

import urllib3
from urllib3.connection import HTTPConnection

from shaperd.discovery.kubernetes.auth import Credential
from shaperd.discovery.kubernetes.errors import ApiStatus, KubernetesConfigError
from shaperd.discovery.kubernetes.kubeconfig import ClientConfig

USER_AGENT = "shaperd"
_MAX_ERROR_BODY = 64 * 1024

_KEEPALIVE = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)] + [
    (socket.IPPROTO_TCP, getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)) if hasattr(socket, name)
]


def ssl_context(cfg: ClientConfig, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> ssl.SSLContext:
    """The TLS client context of ``cfg`` (a client certificate pair overrides cfg's: an exec plugin's)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if cfg.ca_pem:
            ctx.load_verify_locations(cadata=cfg.ca_pem.decode("ascii", "replace"))
        cert_pem, key_pem = cert_pem or cfg.client_cert_pem, key_pem or cfg.client_key_pem
        if cert_pem and key_pem:
            # the ssl module loads a chain from files only: a private temporary directory, gone at once
            with tempfile.TemporaryDirectory(prefix="shaperd-tls-") as d:
                cert_path, key_path = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
                for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(cert_path, key_path)
    except (ssl.SSLError, ValueError) as e:
        raise KubernetesConfigError("load", f"TLS material of {cfg.source or cfg.host}", str(e)) from e
    if cfg.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class ApiClient:
    """GETs against one API server through a small keep-alive pool."""

    def __init__(self, cfg: ClientConfig, *, maxsize: int = 2):
        self.cfg = cfg
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None
        self._pool_cert: tuple[bytes | None, bytes | None] | None = None
        if cfg.host.startswith("https://"):
            self._pool = self._make_pool(None, None)  # bad TLS material fails here, at start, not per request

    def _make_pool(self, cert_pem: bytes | None, key_pem: bytes | None) -> urllib3.PoolManager:
        kw: dict = dict(num_pools=2, maxsize=self._maxsize, block=False, retries=False,
                        socket_options=HTTPConnection.default_socket_options + _KEEPALIVE,
                        headers={"User-Agent": USER_AGENT, "Accept": "application/json"})
        if self.cfg.host.startswith("https://"):
            kw["ssl_context"] = ssl_context(self.cfg, cert_pem, key_pem)
            if self.cfg.insecure_skip_tls_verify:
                kw.update(cert_reqs="CERT_NONE", assert_hostname=False)
            else:
                kw["cert_reqs"] = "CERT_REQUIRED"
            if self.cfg.tls_server_name:
                kw["server_hostname"] = self.cfg.tls_server_name
        self._pool_cert = (cert_pem, key_pem)
        return urllib3.PoolManager(**kw)

    def _pool_for(self, cred: Credential) -> urllib3.PoolManager:
        with self._lock:
            want = (cred.cert_pem, cred.key_pem)
            if self._pool is None or (cred.cert_pem and want != self._pool_cert):
                old, self._pool = self._pool, self._make_pool(*want)  # an exec plugin handed us a new certificate
                if old is not None:
                    old.clear()
            return self._pool

    def url(self, path: str, query: dict[str, str] | None = None) -> str:
        return self.cfg.host + path + (f"?{urlencode(query)}" if query else "")

    def get(self, path: str, query: dict[str, str] | None, timeout: tuple[float, float]) -> urllib3.BaseHTTPResponse:
        """GET ``path``: the unread (streaming) response of a 2xx; ``ApiStatus`` for anything else.

        ``timeout``: (connect_s, read_s); read_s bounds every wait for bytes, so a hung
        server or a silent watch ends in ReadTimeoutError."""
        return self._request("GET", path, query, timeout)

    def patch_json(self, path: str, ops: list[dict], timeout: tuple[float, float]):
        """PATCH ``path`` with an RFC 6902 JSON patch: the decoded object of a 2xx (ValueError when it is not
        JSON); ``ApiStatus`` for anything else (a failed ``test`` op is a 422)."""
        resp = self._request("PATCH", path, None, timeout, body=json.dumps(ops).encode(),
                             content_type="application/json-patch+json")
        try:
            body = resp.read()
        finally:
            resp.release_conn()
        return json.loads(body)

    def _request(self, method: str, path: str, query: dict[str, str] | None, timeout: tuple[float, float],
                 body: bytes | None = None, content_type: str | None = None) -> urllib3.BaseHTTPResponse:
        auth = self.cfg.auth
        cred = auth.credential() if auth is not None else Credential()
        headers = {"Authorization": f"Bearer {cred.token}"} if cred.token else {}
        if content_type:
            headers["Content-Type"] = content_type
        resp = self._pool_for(cred).request(
            method, self.url(path, query), headers=headers, body=body, preload_content=False, redirect=False,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
        if 200 <= resp.status <= 299:
            return resp
        try:
            body = resp.read(_MAX_ERROR_BODY)
        except Exception:  # noqa: BLE001 - the status is the news; a body cut short is not
            body = b""
        finally:
            resp.release_conn()
        if resp.status == 401 and auth is not None:
            auth.invalidate()  # a rotated token or an expired plugin credential: fetch it again next time
        raise status_error(resp.status, resp.reason or "", body)

    def get_json(self, path: str, query: dict[str, str] | None, timeout: tuple[float, float]):
        """GET and decode a JSON body (a list): ValueError when it is not JSON."""
        resp = self.get(path, query, timeout)
        try:
            body = resp.read()
        finally:
            resp.release_conn()
        return json.loads(body)


def status_error(status: int, reason: str, body: bytes) -> ApiStatus:
    """``ApiStatus`` of an error answer, with the Status object's message when the body is one."""
    message = ""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        message = doc["message"]
    return ApiStatus(status, reason, message)
