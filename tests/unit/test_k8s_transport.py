"""The HTTP side of the own client (discovery/kubernetes/transport.py, watchstream.py), no kubernetes package.

TLS against a throwaway CA (tests/tls_fixture.py) served by a tiny in-process HTTPS server on 127.0.0.1
that requires a client certificate and records the Authorization header; the watch line protocol against
a response double that hands out chosen chunks.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3
import yaml

from shaperd.discovery.kubernetes import ResourceExpired, TransientKubernetesError, WatchStreamCorrupt, map_api_error
from shaperd.discovery.kubernetes.errors import ApiStatus
from shaperd.discovery.kubernetes.kubeconfig import load_kubeconfig
from shaperd.discovery.kubernetes.transport import ApiClient
from shaperd.discovery.kubernetes import watchstream
from tests.tls_fixture import Ca


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        srv = self.server
        srv.seen.append({"path": self.path, "auth": self.headers.get("Authorization"),
                         "client": (self.connection.getpeercert() or {}).get("subject")})
        code, body = srv.answers.pop(0) if srv.answers else (200, {"kind": "PodList", "metadata": {"resourceVersion": "7"},
                                                                  "items": []})
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def pki():
    ca, client_ca = Ca("cluster"), Ca("clients")
    return {"ca": ca, "client_ca": client_ca, "serving": ca.issue("kube.example", "127.0.0.1"),
            "named_only": ca.issue("kube.example"), "client": client_ca.issue("shaperd-node", client=True)}


def serve(tmp_path, pki, serving_key: str = "serving"):
    cert, key = pki[serving_key]
    (tmp_path / "srv.crt").write_bytes(cert)
    (tmp_path / "srv.key").write_bytes(key)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    ctx.load_verify_locations(cadata=pki["client_ca"].pem.decode())
    ctx.verify_mode = ssl.CERT_REQUIRED  # like an API server with --client-ca-file
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.seen, srv.answers = [], []
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    return srv


@pytest.fixture
def https(tmp_path, pki):
    made = []

    def make(serving_key: str = "serving"):
        srv = serve(tmp_path, pki, serving_key)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.shutdown()
        srv.server_close()


def kc_for(tmp_path, pki, port: int, *, ca=None, user=None, **cluster) -> str:
    ca = pki["ca"] if ca is None else ca
    cert, key = pki["client"]
    doc = {"clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "certificate-authority-data": b64(ca.pem), **cluster}}],
           "users": [{"name": "u", "user": user or {"client-certificate-data": b64(cert),
                                                   "client-key-data": b64(key), "token": "s3cret"}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], "current-context": "c"}
    p = tmp_path / "kc"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_tls_with_ca_client_certificate_and_bearer_token(tmp_path, pki, https):
    srv = https()
    api = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port)]))
    doc = api.get_json("/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"}, (5.0, 5.0))
    assert doc["metadata"]["resourceVersion"] == "7"
    (seen,) = srv.seen
    assert seen["path"] == "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1" and seen["auth"] == "Bearer s3cret"
    assert ((("commonName", "shaperd-node"),),) == seen["client"]  # the server verified our certificate


def test_an_untrusted_server_is_refused_unless_verification_is_skipped(tmp_path, pki, https):
    srv = https()
    other = Ca("someone else")
    api = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port, ca=other)]))
    with pytest.raises(urllib3.exceptions.HTTPError) as e:
        api.get_json("/api/v1/pods", {}, (5.0, 5.0))
    err = map_api_error("list", "pods", e.value)
    assert isinstance(err, TransientKubernetesError) and "CERTIFICATE_VERIFY_FAILED" in str(err)
    assert srv.seen == []
    insecure = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port, ca=other,
                                                 **{"insecure-skip-tls-verify": True})]))
    assert insecure.get_json("/api/v1/pods", {}, (5.0, 5.0))["kind"] == "PodList"


def test_tls_server_name_is_checked_instead_of_the_address(tmp_path, pki, https):
    srv = https("named_only")  # a certificate for kube.example only, served on 127.0.0.1
    plain = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port)]))
    with pytest.raises(urllib3.exceptions.HTTPError, match="127.0.0.1"):
        plain.get_json("/api/v1/pods", {}, (5.0, 5.0))
    named = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port, **{"tls-server-name": "kube.example"})]))
    assert named.get_json("/api/v1/pods", {}, (5.0, 5.0))["kind"] == "PodList"


def test_error_status_carries_the_message_and_a_401_invalidates_the_credential(tmp_path, pki, https):
    srv = https()
    cfg = load_kubeconfig([kc_for(tmp_path, pki, srv.server_port)])
    invalidated = []
    cfg.auth.invalidate = lambda: invalidated.append(True)
    api = ApiClient(cfg)
    srv.answers[:] = [(403, {"kind": "Status", "code": 403, "message": "pods is forbidden: no list"}),
                      (401, {"kind": "Status", "code": 401, "message": "Unauthorized"})]
    with pytest.raises(ApiStatus) as e:
        api.get("/api/v1/pods", {}, (5.0, 5.0))
    assert e.value.status == 403 and "pods is forbidden: no list" in str(map_api_error("list", "pods", e.value))
    assert not invalidated
    with pytest.raises(ApiStatus, match="HTTP 401"):
        api.get("/api/v1/pods", {}, (5.0, 5.0))
    assert invalidated == [True]
    assert api.get_json("/api/v1/pods", {}, (5.0, 5.0))["kind"] == "PodList"  # the pool survived both


# ---- the watch line protocol

class Chunked:
    """A streaming response double: the body arrives in exactly these chunks."""

    chunked = True

    def __init__(self, *chunks: bytes):
        self.chunks = chunks
        self.closed = self.released = False

    def supports_chunked_reads(self) -> bool:
        return True

    def read_chunked(self, decode_content=True):
        yield from self.chunks

    def close(self):
        self.closed = True

    def release_conn(self):
        self.released = True


def ev(t: str, rv: str) -> bytes:
    return json.dumps({"type": t, "object": {"metadata": {"name": "p", "resourceVersion": rv}}}).encode() + b"\n"


def test_lines_split_across_and_within_chunks():
    a, b, c = ev("ADDED", "1"), ev("BOOKMARK", "2"), ev("DELETED", "3")
    resp = Chunked(a[:10], a[10:] + b + c[:3], b"", c[3:-1])  # the last line arrives without its newline
    got = [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in watchstream.events(resp)]
    assert got == [("ADDED", "1"), ("BOOKMARK", "2"), ("DELETED", "3")]


def test_error_events_and_corrupt_lines():
    gone = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                   "message": "too old resource version: 5 (9)"}}).encode() + b"\n"
    it = watchstream.events(Chunked(ev("ADDED", "1"), b"\n", gone, ev("ADDED", "10")))
    assert next(it)["type"] == "ADDED"  # a blank keepalive line in between is skipped
    with pytest.raises(ApiStatus) as e:
        next(it)
    assert isinstance(map_api_error("watch", "pods", e.value), ResourceExpired) and "too old" in e.value.message
    for bad in (b"not json {\n", b'{"type": "ADDED"}\n', b'{"type": "ERROR", "object": {"message": "x"}}\n'):
        with pytest.raises(WatchStreamCorrupt):
            list(watchstream.events(Chunked(bad)))


def test_an_endless_line_is_corrupt_not_a_memory_leak(monkeypatch):
    monkeypatch.setattr(watchstream, "MAX_LINE_BYTES", 100)
    with pytest.raises(WatchStreamCorrupt, match="longer than 100 bytes"):
        list(watchstream.events(Chunked(*[b"x" * 60] * 3)))


def test_close_returns_a_finished_stream_and_drops_a_cut_one():
    done, cut = Chunked(), Chunked()
    watchstream.close(done, clean=True)
    watchstream.close(cut, clean=False)
    assert (done.released, done.closed) == (True, False) and cut.closed


def test_a_client_certificate_from_an_exec_plugin_is_presented(tmp_path, pki, https):
    import sys

    srv = https()
    cert, key = pki["client"]
    out = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
           "status": {"clientCertificateData": cert.decode(), "clientKeyData": key.decode()}}
    (tmp_path / "cred.json").write_text(json.dumps(out))
    plugin = tmp_path / "plugin"
    plugin.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(tmp_path / 'cred.json')!r}).read())\n")
    plugin.chmod(0o755)
    user = {"exec": {"command": str(plugin), "apiVersion": "client.authentication.k8s.io/v1"}}
    api = ApiClient(load_kubeconfig([kc_for(tmp_path, pki, srv.server_port, user=user)]))
    assert api.get_json("/api/v1/pods", {}, (5.0, 5.0))["kind"] == "PodList"
    assert srv.seen[0]["client"] == ((("commonName", "shaperd-node"),),) and srv.seen[0]["auth"] is None


def test_unusable_tls_material_is_a_config_error_at_start(tmp_path, pki):
    from shaperd.discovery.kubernetes import KubernetesConfigError

    bad = {"client-certificate-data": b64(b"not a certificate"), "client-key-data": b64(b"nor a key")}
    cfg = load_kubeconfig([kc_for(tmp_path, pki, 1, user=bad)])
    with pytest.raises(KubernetesConfigError, match=f"load TLS material of kubeconfig {tmp_path / 'kc'}"):
        ApiClient(cfg)
