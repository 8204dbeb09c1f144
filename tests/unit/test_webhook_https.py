"""``shaperd webhook`` over real HTTPS: AdmissionReview round trips on 127.0.0.1 (an ephemeral port),
a client that verifies a throwaway CA, certificate rotation through a kubelet-style Secret volume,
the tenants file reloaded, and requests that must not hurt the server.

The server runs in a thread of this process (stopped in a finally), except
in the last test, which runs the real command in its own process group.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import jsonpatch
import pytest
from structlog.testing import capture_logs

from shaperd.webhook.admission import Mutator
from shaperd.webhook.reload import TenantsFile, TlsFiles
from shaperd.webhook.server import WebhookServer

from ..tls_fixture import Ca, SecretDir
from .test_webhook_admission import ENV_A, pod, review

TIMEOUT_S = 10  # every client exchange; generous, it bounds failures only
CFG_TEXT = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_0:1"], nccl: {NCCL_IB_TIMEOUT: "22"}}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    match: {namespaces: [team-b]}
    rdma: {serviceLevel: 3, trafficClass: 106, nccl: {NCCL_IB_RETRY_CNT: "7"}}
"""


@pytest.fixture
def pki(tmp_path):
    ca = Ca("shaperd-test-ca")
    secret = SecretDir(tmp_path / "tls", *ca.issue("127.0.0.1", "localhost"))
    return ca, secret, ca.write(tmp_path / "ca.crt")


@contextmanager
def serving(tls_dir: Path, cfg: Path, read_timeout_s: float = 5.0, env_from: str = "skip"):
    srv = WebhookServer("127.0.0.1:0", TlsFiles(tls_dir), TenantsFile(cfg, lambda c: Mutator(c, env_from)),
                        read_timeout_s)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "traffic-shaping.yaml"
    p.write_text(CFG_TEXT)
    return p


def client(srv, cafile: Path) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=str(cafile))
    return http.client.HTTPSConnection("127.0.0.1", srv.address[1], context=ctx, timeout=TIMEOUT_S)


def post(conn: http.client.HTTPSConnection, body: bytes, path="/mutate") -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def apply_response(data: bytes, obj: dict) -> tuple[dict, dict]:
    doc = json.loads(data)
    r = doc["response"]
    if "patch" not in r:
        return r, obj
    assert r["patchType"] == "JSONPatch"
    return r, jsonpatch.apply_patch(obj, json.loads(base64.b64decode(r["patch"])))


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def test_a_tenant_pod_round_trip_adds_the_env_and_keeps_the_pods_own_values(pki, cfg):
    _, secret, cafile = pki
    p = pod({"training-tenant": "tenant-a"}, init=[{"name": "setup"}],
            containers=[{"name": "main", "env": [{"name": "NCCL_IB_TIMEOUT", "value": "99"}]},
                        {"name": "cfg", "envFrom": [{"configMapRef": {"name": "x"}}]}])
    with serving(secret.path, cfg) as srv, capture_logs() as logs:
        conn = client(srv, cafile)
        try:
            status, data = post(conn, review(p, uid="abc-123"))
            # The same connection serves the next review (the API server keeps it open).
            status2, data2 = post(conn, review(pod(), uid="def-456"))
        finally:
            conn.close()
    assert status == 200 and status2 == 200
    r, out = apply_response(data, copy.deepcopy(p))
    assert r["uid"] == "abc-123" and r["allowed"] is True
    assert env_of(out["spec"]["initContainers"][0]) == ENV_A
    assert env_of(out["spec"]["containers"][0]) == {**ENV_A, "NCCL_IB_TIMEOUT": "99"}  # the pod's value stays
    assert out["spec"]["containers"][1] == p["spec"]["containers"][1]  # envFrom: left alone (default)
    r2, out2 = apply_response(data2, pod())
    assert r2 == {"uid": "def-456", "allowed": True} and out2 == pod()  # no tenant: no patch
    mutated = [e for e in logs if e["event"] == "pod mutated"]
    assert mutated and mutated[0]["tenant"] == "tenant-a" and mutated[0]["skipped_env_from"] == ["cfg"]


def test_malformed_bodies_are_allowed_with_no_patch_and_logged_and_the_server_goes_on(pki, cfg):
    _, secret, cafile = pki
    with serving(secret.path, cfg) as srv, capture_logs() as logs:
        answers = []
        for body in (b"{not json", b"[]", json.dumps({"apiVersion": "admission.k8s.io/v1",
                                                      "kind": "AdmissionReview",
                                                      "request": {"uid": "u-7", "kind": "Pod"}}).encode()):
            conn = client(srv, cafile)
            try:
                answers.append(post(conn, body))
            finally:
                conn.close()
        conn = client(srv, cafile)
        try:
            status, data = post(conn, review(pod({"training-tenant": "tenant-a"})))
        finally:
            conn.close()
    assert [(s, json.loads(d)["response"]) for s, d in answers] == [
        (200, {"uid": "", "allowed": True}), (200, {"uid": "", "allowed": True}),
        (200, {"uid": "u-7", "allowed": True})]
    assert [e["reason"] for e in logs if e["event"] == "malformed review allowed without a patch"] == [
        "the body is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "not an admission.k8s.io/v1 AdmissionReview", "request.kind: expected an object"]
    assert status == 200 and "patch" in json.loads(data)["response"]  # still serving, still mutating


def test_a_bug_in_the_review_is_answered_allowed_with_no_patch_and_the_server_goes_on(pki, cfg):
    _, secret, cafile = pki

    class Buggy(Mutator):
        def review(self, body):
            if b"boom" in body:
                raise ZeroDivisionError("a bug")
            return super().review(body)

    srv = WebhookServer("127.0.0.1:0", TlsFiles(secret.path), TenantsFile(cfg, Buggy), 5.0)
    srv.start()
    try:
        with capture_logs() as logs:
            conn = client(srv, cafile)
            try:
                boom = post(conn, review(pod({"training-tenant": "boom"}), uid="u-boom"))
                fine = post(conn, review(pod({"training-tenant": "tenant-a"})))
            finally:
                conn.close()
    finally:
        srv.stop()
    assert boom[0] == 200 and json.loads(boom[1])["response"] == {"uid": "u-boom", "allowed": True}
    assert fine[0] == 200 and "patch" in json.loads(fine[1])["response"]
    assert any(e["event"].startswith("review failed with an internal error") for e in logs)


def test_a_rotated_certificate_is_served_on_the_next_connection_and_a_broken_one_is_not(pki, cfg, tmp_path):
    ca1, secret, ca1_file = pki
    ca2 = Ca("rotated-ca")
    ca2_file = ca2.write(tmp_path / "ca2.crt")
    with serving(secret.path, cfg) as srv, capture_logs() as logs:
        def roundtrip(cafile):
            conn = client(srv, cafile)
            try:
                return post(conn, review(pod({"training-tenant": "tenant-a"})))[0]
            finally:
                conn.close()

        assert roundtrip(ca1_file) == 200
        secret.rotate(*ca2.issue("127.0.0.1"))  # cert-manager renewed, from another CA this time
        with pytest.raises(ssl.SSLCertVerificationError):
            roundtrip(ca1_file)
        assert roundtrip(ca2_file) == 200
        cert, _ = ca1.issue("127.0.0.1")
        _, other_key = ca1.issue("127.0.0.1")
        secret.rotate(cert, other_key)  # a key that does not match: the CA2 certificate stays
        assert roundtrip(ca2_file) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            roundtrip(ca1_file)
    events = [e["event"] for e in logs]
    assert events.count("TLS certificate reloaded") == 1
    assert "TLS certificate not loaded; keeping the previous one" in events


def test_the_tenants_file_is_reloaded_and_a_bad_version_keeps_the_last_good(pki, cfg):
    _, secret, cafile = pki
    body = review(pod({"training-tenant": "tenant-a"}))

    def env(srv):
        conn = client(srv, cafile)
        try:
            _, data = post(conn, body)
        finally:
            conn.close()
        return env_of(apply_response(data, pod({"training-tenant": "tenant-a"}))[1]["spec"]["containers"][0])

    with serving(secret.path, cfg) as srv:
        assert env(srv)["NCCL_IB_TIMEOUT"] == "22"
        cfg.write_text(CFG_TEXT.replace('"22"', '"23"'))
        assert env(srv)["NCCL_IB_TIMEOUT"] == "23"
        cfg.write_text(CFG_TEXT.replace("serviceLevel: 3", "serviceLevel: 15"))  # invalid
        assert env(srv)["NCCL_IB_TIMEOUT"] == "23"


def test_readiness_needs_a_valid_tenants_file_and_unknown_paths_are_404(pki, tmp_path):
    _, secret, cafile = pki
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: []\n")
    with serving(secret.path, bad) as srv:
        conn = client(srv, cafile)
        try:
            conn.request("GET", "/readyz")
            r = conn.getresponse()
            assert (r.status, r.read()) == (503, b"not ready: no valid tenants file\n")
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            assert (r.status, r.read()) == (200, b"ok\n")
            assert post(conn, b"{}", path="/other")[0] == 404
            status, data = post(conn, review(pod({"training-tenant": "tenant-a"})))
            assert status == 200 and json.loads(data)["response"] == {"uid": "u-1", "allowed": True}
        finally:
            conn.close()


def test_an_oversized_body_is_refused_and_a_trickled_one_is_cut_at_the_deadline(pki, cfg):
    _, secret, cafile = pki
    with serving(secret.path, cfg, read_timeout_s=0.5) as srv:
        conn = client(srv, cafile)
        try:
            conn.putrequest("POST", "/mutate")
            conn.putheader("Content-Length", str(64 * 1024 * 1024))
            conn.endheaders()
            r = conn.getresponse()
            assert r.status == 413
        finally:
            conn.close()
        ctx = ssl.create_default_context(cafile=str(cafile))
        with socket.create_connection(("127.0.0.1", srv.address[1]), timeout=TIMEOUT_S) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            # The rest never comes: the server gives up at its deadline and closes; recv sees EOF.
            assert s.recv(1) == b""


def test_the_command_serves_until_sigterm(pki, cfg, tmp_path):
    _, secret, cafile = pki
    argv = [sys.executable, "-m", "shaperd", "--log-json", "webhook", "--address", "127.0.0.1:0",
            "--tls-dir", str(secret.path), "--config", str(cfg)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        port = _listening_port(proc, deadline=time.monotonic() + 60)
        ctx = ssl.create_default_context(cafile=str(cafile))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=TIMEOUT_S)
        try:
            status, data = post(conn, review(pod(), namespace="team-b"))
        finally:
            conn.close()
        assert status == 200
        _, out = apply_response(data, pod())
        assert env_of(out["spec"]["containers"][0]) == {"NCCL_IB_SL": "3", "NCCL_IB_TC": "106",
                                                        "NCCL_IB_RETRY_CNT": "7"}
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stderr.close()


def _listening_port(proc, deadline: float) -> int:
    """The port from the 'listening' log line (JSON on stderr), waiting on the pipe, never sleeping."""
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        for line in buf.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "listening":
                return int(ev["address"].rsplit(":", 1)[1])
    raise AssertionError(f"no 'listening' line from the webhook: {buf.decode(errors='replace')}")


def test_a_failed_handshake_is_one_log_line_and_the_next_client_is_served(pki, cfg):
    _, secret, cafile = pki
    with serving(secret.path, cfg) as srv, capture_logs() as logs:
        plain = http.client.HTTPConnection("127.0.0.1", srv.address[1], timeout=TIMEOUT_S)
        try:
            with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
                plain.request("GET", "/healthz")
                plain.getresponse()
        finally:
            plain.close()
        deadline = time.monotonic() + TIMEOUT_S  # the server logs on the connection's thread
        while not any(e["event"] == "connection failed" for e in logs) and time.monotonic() < deadline:
            time.sleep(0.01)
        conn = client(srv, cafile)
        try:
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            assert (r.status, r.read()) == (200, b"ok\n")
        finally:
            conn.close()
    failed = [e for e in logs if e["event"] == "connection failed"]
    assert [e["client"] for e in failed] == ["127.0.0.1"] and failed[0]["error"].startswith("SSLError: ")
