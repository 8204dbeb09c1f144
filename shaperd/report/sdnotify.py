"""Tell systemd how the agent is doing: the sd_notify(3) datagram protocol, without libsystemd.

Owns the messages to the service manager of a ``Type=notify`` unit: ``READY=1``
once the loop has made its first pass (enforcement in place, or the reason in
STATUS=), ``RELOADING=1`` while SIGHUP's reload runs (then ``READY=1`` again),
``STOPPING=1`` on the way out, and ``WATCHDOG=1`` at half the WatchdogSec= period,
sent only by the loop itself and only while the caller says it is healthy: a
loop that hangs or keeps failing stops feeding, and systemd restarts the agent
(Restart=on-failure).

The address comes from $NOTIFY_SOCKET (a path, or ``@name`` in the abstract
namespace), the watchdog period from $WATCHDOG_USEC (for this pid only, when
$WATCHDOG_PID is set). Without $NOTIFY_SOCKET every call is a no-op, so the
daemon calls it unconditionally (Kubernetes, a terminal, tests).

Must not: block the loop (non-blocking datagrams, failures logged once and
dropped), or decide health: the daemon passes its verdict in.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

from shaperd.core import log

_log = log.get("shaperd.sdnotify")


def watchdog_interval_s(env: Mapping[str, str], pid: int) -> float | None:
    """How often to send WATCHDOG=1: half of $WATCHDOG_USEC (sd_watchdog_enabled(3)), or None when off."""
    usec = env.get("WATCHDOG_USEC", "")
    wpid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if wpid and (not wpid.isdigit() or int(wpid) != pid):
        return None  # meant for another process (e.g. our parent)
    return int(usec) / 2e6


def socket_address(raw: str) -> str | bytes | None:
    """$NOTIFY_SOCKET as a sendto() address: an absolute path, or ``@name`` for the abstract namespace."""
    if raw.startswith("/"):
        return raw
    if raw.startswith("@") and len(raw) > 1:
        return b"\0" + raw[1:].encode()
    return None  # empty, or a form we do not speak (e.g. vsock:): notify nothing


class Notifier:
    """sd_notify for the daemon loop; every method is a no-op when not run by systemd."""

    def __init__(self, env: Mapping[str, str] | None = None, pid: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        env = os.environ if env is None else env
        pid = os.getpid() if pid is None else pid
        self.address = socket_address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_s = watchdog_interval_s(env, pid) if self.address is not None else None
        self._clock = clock
        self._sock: socket.socket | None = None
        self._ready = False
        self._next_feed = 0.0
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One datagram of ``KEY=value`` lines; False if it could not be sent (logged once)."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError as e:
            if not self._warned:
                self._warned = True
                _log.warning("sd_notify failed", socket=str(self.address), error=e.strerror or str(e))
            return False

    def loop_pass(self, healthy: bool, status: str = "") -> None:
        """Called once per loop iteration: READY=1 the first time, then the watchdog while ``healthy``."""
        if self.address is None:
            return
        now = self._clock()
        if not self._ready:
            self._ready = True
            self.send("READY=1", f"STATUS={status}" if status else "STATUS=running", f"MAINPID={os.getpid()}")
        if self.watchdog_s is None or not healthy or now < self._next_feed:
            return
        self._next_feed = now + self.watchdog_s
        self.send("WATCHDOG=1")

    def reloading(self) -> None:
        # MONOTONIC_USEC: Type=notify-reload (systemd 253+) requires it; older managers ignore it.
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                  "STATUS=reloading the tenants file")

    def reloaded(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping; enforcement left in place")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
