"""Every long-running process the bed starts, and how they are all ended.

A :class:`ProcessRegistry` starts processes (iperf3 servers and clients, ping,
the shaperd CLI) in their own session with ``PR_SET_PDEATHSIG=SIGKILL`` so that
they die with the bed even if the bed itself is killed hard, remembers them,
and kills them all (process group, TERM then KILL) on :meth:`stop_all`.
The topology additionally kills anything still inside its namespaces
(``ip netns pids``) before deleting them, as a last safety net.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from .cmd import in_netns

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - best effort only
        pass


class ProcessRegistry:
    """Starts and tracks processes; :meth:`stop_all` ends every one of them."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def spawn(self, argv: Sequence[str], netns: str | None = None, *,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
        full = in_netns(netns, argv)
        proc = subprocess.Popen(full, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True, preexec_fn=_child_setup)
        with self._lock:
            self._procs.append(proc)
        return proc

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs]

    def live(self) -> list[subprocess.Popen]:
        with self._lock:
            return [p for p in self._procs if p.poll() is None]

    def forget(self, proc: subprocess.Popen) -> None:
        """Drop a process that has been waited for."""
        with self._lock:
            if proc in self._procs and proc.poll() is not None:
                self._procs.remove(proc)

    def stop(self, proc: subprocess.Popen, grace: float = 1.0) -> None:
        """End one process (its whole process group): TERM, wait *grace*, KILL."""
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
                pass
        _close_pipes(proc)

    def stop_all(self, grace: float = 1.0) -> None:
        """End every process started through this registry."""
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                p.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
            _close_pipes(p)
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)  # own session => pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError:  # pragma: no cover
        proc.send_signal(sig)


def _close_pipes(proc: subprocess.Popen) -> None:
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            try:
                f.close()
            except Exception:  # pragma: no cover
                pass
