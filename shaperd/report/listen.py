"""Where shaperd's HTTP endpoints listen, and the threaded HTTP(S) server they run on.

Owns: parsing a listen address (``HOST:PORT``, ``:PORT`` for every interface,
``[IPv6]:PORT``), binding it (an IPv6 socket for an IPv6 host and for every
interface, dual-stack where the node allows it; ``:PORT`` on a node without
IPv6 falls back to every IPv4 interface), and each connection's set-up on its
own thread: a read timeout, then the TLS handshake when the server serves
TLS, so a slow client holds only its own thread, never accept. Served from a
daemon thread until ``stop``.

Used by the metrics endpoint (report/http.py) and the admission webhook
(webhook/server.py); what is served, and who may ask, is theirs.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import TypeVar

S = TypeVar("S", bound="ThreadedServer")


def parse_address(addr: str, flag: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' (every interface: host "") or '[V6]:PORT' -> (host, port).

    ``flag`` names the option in the error ("--metrics-address")."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{flag} {addr!r}: expected HOST:PORT, :PORT or [IPv6]:PORT")
    return host.strip("[]"), int(port)


def bind(make: Callable[[str, int], S], host: str, port: int) -> S:
    """The server ``make(host, port)`` builds; every interface (host "") is tried as [::] first and, on a
    node without IPv6, as 0.0.0.0."""
    try:
        return make(host, port)
    except OSError:
        if host:
            raise
        return make("0.0.0.0", port)


class ThreadedServer(ThreadingHTTPServer):
    """One thread per connection; subclasses choose TLS per connection (``connection_tls``)."""

    daemon_threads = True
    client_timeout_s: float = 10.0  # each read of a connection, the TLS handshake included

    def __init__(self, host: str, port: int, handler) -> None:
        if ":" in host or host == "":
            self.address_family = socket.AF_INET6  # "" binds [::] (dual-stack where allowed)
            host = host or "::"
        self._thread: threading.Thread | None = None
        super().__init__((host, port), handler)

    # -- per connection, on its own thread -----------------------------------------
    def connection_tls(self) -> tuple[ssl.SSLContext | None, object]:
        """The TLS context for the connection being set up (None: plain HTTP), and what its handler is
        given with it (``handle_connection``): read once, so both come from the same configuration."""
        return None, None

    def handle_connection(self, conn, client_address, state: object) -> None:
        self.RequestHandlerClass(conn, client_address, self)

    def handshake_failed(self, client_address, error: OSError) -> None:
        """A client whose TLS handshake failed or timed out: nothing was served (by default, no log)."""

    def finish_request(self, request, client_address) -> None:
        request.settimeout(self.client_timeout_s)
        ctx, state = self.connection_tls()
        if ctx is None:
            self.handle_connection(request, client_address, state)
            return
        try:
            conn = ctx.wrap_socket(request, server_side=True)  # the handshake, bounded by the timeout
        except OSError as e:  # ssl.SSLError included
            self.handshake_failed(client_address, e)
            return
        try:
            self.handle_connection(conn, client_address, state)
        finally:
            self.shutdown_request(conn)  # the raw socket was handed to conn; the caller's close is a no-op

    # -- the serving thread ------------------------------------------------------------
    def serve_in_thread(self, name: str, poll_interval_s: float = 0.5) -> None:
        """Serve from a daemon thread; ``stop`` returns within about ``poll_interval_s``."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": poll_interval_s},
                                        name=name, daemon=True)
        self._thread.start()

    def stop(self, join_s: float = 10.0) -> None:
        """Stop serving and close the listening socket (connections in flight finish on their threads)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=join_s)
        self.server_close()
