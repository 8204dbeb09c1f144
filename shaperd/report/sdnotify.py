"""Tell systemd how the agent is doing: the sd_notify(3) datagram protocol, without libsystemd.

Owns the messages to the service manager of a ``Type=notify`` unit: ``READY=1``
the first time the caller says it is ready (the daemon: once its first
reconcile ran), ``STATUS=`` whenever the caller's one-line status changes
(before READY=1: what it waits for), ``RELOADING=1`` while SIGHUP's reload runs
(then ``READY=1`` again, once ready), ``STOPPING=1`` on the way out, and
``WATCHDOG=1`` at half the WatchdogSec= period, sent only by the loop itself and
only while the caller says it is healthy: a loop that hangs or keeps failing
stops feeding, and systemd restarts the agent (Restart=on-failure). Whether it
is ready or degraded does not change the feed: systemd acts on the watchdog
only after start-up, and a restart does not fix what a degraded node lacks.

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
        self._status: str | None = None  # the last STATUS= sent
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

    @property
    def ready(self) -> bool:
        """READY=1 was sent (and not taken back: a reload sends it again)."""
        return self._ready

    def loop_pass(self, healthy: bool, status: str = "", ready: bool = True) -> None:
        """Called once per loop iteration: READY=1 the first time ``ready``, STATUS= when ``status`` changed,
        and the watchdog while ``healthy`` (ready or not)."""
        if self.address is None:
            return
        now = self._clock()
        if ready and not self._ready:
            self._ready = True
            self._status = status or "running"
            self.send("READY=1", f"STATUS={self._status}", f"MAINPID={os.getpid()}")
        else:
            self.status(status)
        if self.watchdog_s is None or not healthy or now < self._next_feed:
            return
        self._next_feed = now + self.watchdog_s
        self.send("WATCHDOG=1")

    def status(self, text: str) -> None:
        """STATUS=text, unless it is empty or what was sent last (systemctl status shows the last one)."""
        if self.address is None or not text or text == self._status:
            return
        self._status = text
        self.send(f"STATUS={text}")

    def reloading(self) -> None:
        if not self._ready:  # still starting: systemd takes RELOADING=1 only from a started unit
            self.status("reloading the tenants file")
            return
        self._status = "reloading the tenants file"
        # MONOTONIC_USEC: Type=notify-reload (systemd 253+) requires it; older managers ignore it.
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                  f"STATUS={self._status}")

    def reloaded(self, status: str) -> None:
        """The reload is over: READY=1 again, if the unit was ready (before, READY=1 still waits for the loop)."""
        if not self._ready:
            self.status(status)
            return
        self._status = status
        self.send("READY=1", f"STATUS={status}")

    def stopping(self) -> None:
        self._status = "stopping; enforcement left in place"
        self.send("STOPPING=1", f"STATUS={self._status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
