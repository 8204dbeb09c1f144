"""``shaperd run --web.config.file``: the daemon serves /metrics over TLS with basic auth from an
exporter-toolkit web config, refuses writes, and refuses to start on a bad web config (issue 14)."""

from __future__ import annotations

import base64
import http.client
import signal
import socket
import ssl
import subprocess

import bcrypt
from shaperd_bed import netns

from tests.tls_fixture import Ca

from .conftest import PY, needs_root, wait_for
from .test_core import MATCH, NODE

pytestmark = needs_root


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(port, ctx, method="GET", path="/metrics", auth=None):
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        c.request(method, path, headers={"Authorization": "Basic " + base64.b64encode(auth).decode()} if auth else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_daemon_serves_metrics_with_tls_and_basic_auth(bed, tmp_path):
    ca = Ca("metrics")
    cert, key = ca.issue("127.0.0.1")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    wc = tmp_path / "web.yml"
    wc.write_text(f"tls_server_config: {{cert_file: tls.crt, key_file: tls.key}}\nbasic_auth_users: {{prom: '{hashed}'}}\n")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(NODE + MATCH)
    port = free_port()
    daemon = bed.spawn([PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--netns", bed.node,
                        "--no-kubernetes", "--metrics-address", f"127.0.0.1:{port}", "--web.config.file", str(wc)],
                       None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ctx = ssl.create_default_context(cadata=ca.pem.decode())

    def up():
        try:
            return get(port, ctx, path="/readyz")[0] in (200, 503)
        except OSError:
            return daemon.poll() is not None

    assert wait_for(up, 30) and daemon.poll() is None
    assert get(port, ctx)[0] == 401
    status, body = get(port, ctx, auth=b"prom:pw")
    assert status == 200 and b"shaperd_reconciles_total" in body
    assert get(port, ctx, "POST", "/metrics", auth=b"prom:pw")[0] == 405
    assert get(port, ctx, "DELETE", "/readyz")[0] == 405
    daemon.send_signal(signal.SIGTERM)
    out, _ = daemon.communicate(timeout=15)
    assert daemon.returncode == 0, out


def test_bad_web_config_stops_the_start_with_a_typed_message(bed, tmp_path):
    wc = tmp_path / "web.yml"
    wc.write_text("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(NODE + MATCH)
    r = netns.run([PY, "-m", "shaperd", "run", "--config", str(cfg), "--netns", bed.node, "--no-kubernetes",
                   "--metrics-address", f"127.0.0.1:{free_port()}", "--web.config.file", str(wc)],
                  check=False, timeout=60)  # own process group and a deadline
    assert r.returncode != 0
    assert f"load web config {wc}: tls_server_config.cert_file:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
