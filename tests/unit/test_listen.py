"""report/listen.py: the listen-address forms accepted and refused, the fallback for a node without IPv6,
and each connection's set-up (TLS on its own thread) that the metrics endpoint and the webhook share.

Servers bind loopback ephemeral ports and are stopped in a finally; every wait has a deadline.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from shaperd.report import listen
from tests.tls_fixture import Ca

WAIT_S = 10  # bounds failures only


@pytest.mark.parametrize("addr,want", [
    ("127.0.0.1:9090", ("127.0.0.1", 9090)),
    (":9090", ("", 9090)),  # every interface
    ("[::1]:8443", ("::1", 8443)),
    ("[::]:8443", ("::", 8443)),
    ("[2001:db8::7]:1", ("2001:db8::7", 1)),
    ("localhost:0", ("localhost", 0)),  # 0: an ephemeral port
    ("node-1.example:65535", ("node-1.example", 65535)),
    ("198.18.0.1:08443", ("198.18.0.1", 8443)),
])
def test_accepted_forms(addr, want):
    assert listen.parse_address(addr, "--metrics-address") == want


@pytest.mark.parametrize("addr", ["", "9090", "host", "host:", "host:http", "host:65536", "host:-1", "host:+80",
                                  "host: 80", "[::1]", "::"])
@pytest.mark.parametrize("flag", ["--metrics-address", "--address"])
def test_refused_forms_name_the_flag_the_value_and_what_is_expected(addr, flag):
    with pytest.raises(ValueError) as e:
        listen.parse_address(addr, flag)
    assert str(e.value) == f"{flag} {addr!r}: expected HOST:PORT, :PORT or [IPv6]:PORT"


def test_every_interface_falls_back_to_ipv4_on_a_node_without_ipv6():
    tried = []

    def make(host, port):
        tried.append((host, port))
        if host == "":
            raise OSError(97, "Address family not supported by protocol")
        return "server"

    assert listen.bind(make, "", 9090) == "server" and tried == [("", 9090), ("0.0.0.0", 9090)]


def test_a_named_host_that_cannot_be_bound_is_an_error_not_a_fallback():
    def make(host, port):
        raise OSError(99, "Cannot assign requested address")

    with pytest.raises(OSError) as e:
        listen.bind(make, "198.18.0.1", 9090)
    assert e.value.errno == 99


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = f"hello {self.server.last_state}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


class Server(listen.ThreadedServer):
    """A ThreadedServer answering "hello STATE"; TLS when given a context."""

    def __init__(self, host, port, ctx=None, client_timeout_s=WAIT_S):
        self.ctx, self.client_timeout_s = ctx, client_timeout_s
        self.states = iter(range(1, 1000))
        self.last_state = None
        self.failed: list[tuple[str, OSError]] = []
        self.failed_event = threading.Event()
        self.taken = threading.Semaphore(0)  # released once per connection that took its state
        super().__init__(host, port, Hello)

    def connection_tls(self):
        state = next(self.states)
        self.taken.release()
        return self.ctx, state

    def handle_connection(self, conn, client_address, state):
        self.last_state = state
        super().handle_connection(conn, client_address, state)

    def handshake_failed(self, client_address, error):
        self.failed.append((client_address[0], error))
        self.failed_event.set()


def serving(server):
    server.serve_in_thread("test-listen", poll_interval_s=0.05)
    return server


@pytest.mark.parametrize("host,family,bound", [
    ("127.0.0.1", socket.AF_INET, "127.0.0.1"),
    ("::1", socket.AF_INET6, "::1"),
    ("", socket.AF_INET6, "::"),  # every interface: [::], dual-stack where the node allows it
])
def test_the_address_family_follows_the_host(host, family, bound):
    s = Server(host, 0)
    try:
        assert s.address_family == family and s.socket.family == family and s.server_address[0] == bound
    finally:
        s.stop()


def get(port, ctx=None, host="127.0.0.1"):
    c = (http.client.HTTPSConnection(host, port, context=ctx, timeout=WAIT_S) if ctx is not None
         else http.client.HTTPConnection(host, port, timeout=WAIT_S))
    try:
        c.request("GET", "/")
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_plain_http_is_served_and_the_handler_gets_the_state_read_with_the_connection():
    s = serving(Server("127.0.0.1", 0))
    try:
        assert get(s.server_address[1]) == (200, b"hello 1\n")
        assert get(s.server_address[1]) == (200, b"hello 2\n")  # read per connection
    finally:
        s.stop()


@pytest.fixture
def tls(tmp_path):
    ca = Ca("listen-ca")
    cert, key = ca.issue("127.0.0.1")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return server, ssl.create_default_context(cadata=ca.pem.decode())


def test_tls_is_served_and_a_client_stalled_in_its_handshake_holds_only_its_own_thread(tls):
    server_ctx, client_ctx = tls
    # The stalled handshake ends when the client closes, not at the server's read timeout: that timeout is far
    # above WAIT_S, so a busy machine that makes the served request slow cannot end the stall first.
    s = serving(Server("127.0.0.1", 0, server_ctx, client_timeout_s=30 * WAIT_S))
    port = s.server_address[1]
    stalled = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)  # connects, never says hello
    try:
        # Its thread has taken state 1 (each connection's thread takes its own: on a busy machine the next
        # connection's thread could otherwise take it first).
        assert s.taken.acquire(timeout=WAIT_S)
        assert get(port, client_ctx) == (200, b"hello 2\n")  # served while the first waits in its handshake
        assert s.failed == []
        stalled.close()  # its handshake fails now, on its own thread: nothing served, the hook told
        assert s.failed_event.wait(WAIT_S) and [c for c, _ in s.failed] == ["127.0.0.1"]
        assert isinstance(s.failed[0][1], OSError)
    finally:
        stalled.close()
        s.stop()


def test_plain_http_to_a_tls_server_is_a_failed_handshake_and_nothing_is_served(tls):
    server_ctx, _ = tls
    s = serving(Server("127.0.0.1", 0, server_ctx))
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            get(s.server_address[1])
        assert s.failed_event.wait(WAIT_S) and isinstance(s.failed[0][1], ssl.SSLError)
        assert s.last_state is None  # no handler ran
    finally:
        s.stop()


def test_stop_before_start_does_not_hang():
    s = Server("127.0.0.1", 0)
    s.stop()
    assert s.socket.fileno() == -1
