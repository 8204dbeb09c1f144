"""The metrics endpoint (report/http.py, report/webconfig.py): read-only, TLS and basic auth from an
exporter-toolkit web config file, and typed refusals of what it does not support."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl

import bcrypt
import pytest

from shaperd.report.http import MetricsServer
from shaperd.report.metrics import Metrics
from shaperd.report.webconfig import WebConfigError, from_dict, load
from tests.tls_fixture import Ca, SecretDir

# Cost 4: the lowest bcrypt allows, so the tests are quick; the server treats any cost the same.
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
METHODS = ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND", "FOO"]
PATHS = ["/metrics", "/healthz", "/readyz", "/", "/debug", "/metrics/../x", "/reload", "/quitquitquit"]


class ReadOnlyMetrics:
    """What the handlers may use: the three read methods. Anything else (a write hook) is an error."""

    def __init__(self):
        self.real = Metrics(None, wall=lambda: 1.7e9, monotonic=lambda: 100.0)  # frozen clocks: comparable bodies
        self.calls: list[str] = []

    def exposition(self):
        self.calls.append("exposition")
        return self.real.exposition()

    def healthy(self):
        self.calls.append("healthy")
        return self.real.healthy()

    def ready(self):
        self.calls.append("ready")
        return self.real.ready()


@pytest.fixture
def server_factory():
    servers = []

    def make(web_config_file=None, metrics=None):
        s = MetricsServer("127.0.0.1:0", metrics or ReadOnlyMetrics(), web_config_file)
        s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def request(server, method, path, headers=None, ctx=None, body=None):
    host, port = server.address[:2]
    if ctx is not None:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    else:
        c = http.client.HTTPConnection(host, port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def state_lines(body: bytes) -> list[bytes]:
    """The exposition less what each scrape measures: the collectors' timing and the process's own figures."""
    moving = (b"shaperd_scrape_collector_duration_seconds{", b"process_")
    return [ln for ln in body.splitlines() if not ln.startswith(moving)]


def basic(user, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_every_method_but_get_is_refused_on_every_path_and_nothing_is_written(server_factory):
    m = ReadOnlyMetrics()
    s = server_factory(metrics=m)
    before = state_lines(m.real.exposition())
    for method in METHODS:
        for path in PATHS:
            status, headers, _ = request(s, method, path, body=b"x=1" if method in ("POST", "PUT", "PATCH") else None)
            assert status == 405, (method, path, status)
            assert headers.get("Allow") == "GET"
    assert m.calls == []  # a refused request never reached a handler
    for path in PATHS:
        status, _, _ = request(s, "GET", path)
        assert status == (200 if path == "/metrics" else 503 if path == "/readyz" else 404 if path != "/healthz"
                          else status), (path, status)
    # GET handlers only read: the exposition is unchanged (no request counter, no state change).
    assert state_lines(m.real.exposition()) == before
    assert set(m.calls) <= {"exposition", "healthy", "ready"}


def test_basic_auth_from_web_config_guards_metrics_but_not_the_probes(server_factory, tmp_path):
    wc = tmp_path / "web.yml"
    wc.write_text(f"basic_auth_users:\n  alice: {HASH}\n")
    s = server_factory(str(wc))
    assert request(s, "GET", "/metrics")[0] == 401
    status, headers, _ = request(s, "GET", "/metrics", basic("alice", "wrong"))
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert request(s, "GET", "/metrics", basic("mallory", "s3cret"))[0] == 401
    assert request(s, "GET", "/metrics", {"Authorization": "Basic !!notbase64"})[0] == 401
    assert request(s, "GET", "/metrics", {"Authorization": "Bearer abc"})[0] == 401
    assert request(s, "GET", "/metrics", basic("alice", "s3cret"))[0] == 200
    assert request(s, "GET", "/metrics", basic("alice", "s3cret"))[0] == 200  # the cached success
    assert request(s, "GET", "/readyz")[0] in (200, 503)  # probes: no credentials needed
    assert request(s, "POST", "/metrics", basic("alice", "s3cret"))[0] == 405


def test_tls_and_auth_and_headers_with_certificate_rotation(server_factory, tmp_path):
    ca = Ca("metrics-ca")
    secret = SecretDir(tmp_path / "tls", *ca.issue("127.0.0.1"))
    wc = tmp_path / "web.yml"
    wc.write_text("tls_server_config:\n  cert_file: tls/tls.crt\n  key_file: tls/tls.key\n  min_version: TLS12\n"
                  f"basic_auth_users:\n  alice: {HASH}\n"
                  "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    s = server_factory(str(wc))
    assert s.scheme == "https"
    ctx = ssl.create_default_context(cadata=ca.pem.decode())
    status, headers, body = request(s, "GET", "/metrics", basic("alice", "s3cret"), ctx=ctx)
    assert status == 200 and b"shaperd_" in body and headers["X-Content-Type-Options"] == "nosniff"
    # Plain HTTP to the TLS port gets nothing served.
    with pytest.raises((http.client.HTTPException, ConnectionError, socket.timeout, OSError)):
        request(s, "GET", "/metrics", basic("alice", "s3cret"))
    # Rotate to a certificate from another CA: the next connection serves it.
    ca2 = Ca("metrics-ca-2")
    secret.rotate(*ca2.issue("127.0.0.1"))
    with pytest.raises(ssl.SSLCertVerificationError):
        request(s, "GET", "/metrics", basic("alice", "s3cret"), ctx=ctx)
    ctx2 = ssl.create_default_context(cadata=ca2.pem.decode())
    assert request(s, "GET", "/metrics", basic("alice", "s3cret"), ctx=ctx2)[0] == 200


def test_client_certificates_required_when_configured(server_factory, tmp_path):
    ca = Ca("ca")
    cert, key = ca.issue("127.0.0.1")
    (tmp_path / "s.crt").write_bytes(cert)
    (tmp_path / "s.key").write_bytes(key)
    ca.write(tmp_path / "ca.crt")
    wc = tmp_path / "web.yml"
    wc.write_text("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n"
                  "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")
    s = server_factory(str(wc))
    ctx = ssl.create_default_context(cadata=ca.pem.decode())
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
        request(s, "GET", "/metrics", ctx=ctx)
    ccert, ckey = client_cert(ca)
    (tmp_path / "c.crt").write_bytes(ccert)
    (tmp_path / "c.key").write_bytes(ckey)
    ctx.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    assert request(s, "GET", "/metrics", ctx=ctx)[0] == 200


def client_cert(ca: Ca) -> tuple[bytes, bytes]:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prometheus")]))
            .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@pytest.mark.parametrize("doc,field", [
    ({"tls_server_config": {"cert": "PEM", "key": "PEM"}}, "tls_server_config.cert"),
    ({"tls_server_config": {"cert_file": "x.crt", "key_file": "x.key", "cipher_suites": ["A"]}},
     "tls_server_config.cipher_suites"),
    ({"rate_limit": {"interval": "1s", "burst": 20}}, "rate_limit"),
    ({"basic_auth_users": {"alice": "plaintext"}}, "basic_auth_users.alice"),
    ({"basic_auth_users": ["alice"]}, "basic_auth_users"),
    ({"tls_server_config": {"key_file": "x.key"}}, "tls_server_config.cert_file"),
    ({"tls_config": {}}, "tls_config"),
    ({"http_server_config": {"headers": {"Set-Cookie": "a=b"}}}, "http_server_config.headers.Set-Cookie"),
    ({"http_server_config": {"headers": {"X-Frame-Options": "deny\r\nX-Evil: 1"}}},
     "http_server_config.headers.X-Frame-Options"),
])
def test_unsupported_or_bad_settings_are_refused_naming_the_field(doc, field, tmp_path):
    with pytest.raises(WebConfigError) as e:
        from_dict(doc, str(tmp_path / "web.yml"))
    assert e.value.field == field
    assert str(e.value).startswith(f"load web config {tmp_path / 'web.yml'}: {field}: ")


def test_mismatched_key_missing_files_and_bad_yaml_are_refused(tmp_path):
    ca = Ca("ca")
    cert, _ = ca.issue("127.0.0.1")
    _, other_key = ca.issue("127.0.0.1")
    (tmp_path / "s.crt").write_bytes(cert)
    (tmp_path / "s.key").write_bytes(other_key)
    (tmp_path / "w.yml").write_text("tls_server_config: {cert_file: s.crt, key_file: s.key}\n")
    with pytest.raises(WebConfigError, match="load certificate"):
        load(str(tmp_path / "w.yml"))
    (tmp_path / "w.yml").write_text("tls_server_config: {cert_file: nope.crt, key_file: s.key}\n")
    with pytest.raises(WebConfigError, match="nope.crt: no such file"):
        load(str(tmp_path / "w.yml"))
    (tmp_path / "w.yml").write_text("tls_server_config: [\n")
    with pytest.raises(WebConfigError, match="not valid YAML"):
        load(str(tmp_path / "w.yml"))
    with pytest.raises(WebConfigError, match="cannot read file"):
        load(str(tmp_path / "missing.yml"))
    (tmp_path / "empty.yml").write_text("")
    assert load(str(tmp_path / "empty.yml")).tls is None


def test_a_bad_rewrite_of_the_web_config_keeps_the_last_good_one(server_factory, tmp_path):
    wc = tmp_path / "web.yml"
    wc.write_text(f"basic_auth_users:\n  alice: {HASH}\n")
    s = server_factory(str(wc))
    wc.write_text("basic_auth_users: [broken\n")
    assert request(s, "GET", "/metrics")[0] == 401  # still guarded
    assert request(s, "GET", "/metrics", basic("alice", "s3cret"))[0] == 200
