"""Helper processes for tests: each in its own process group, with a deadline, ended by group id.

A test that starts a process (a daemon, a traffic generator, a scrape)
must not leave it behind, even when the test fails or the process hangs:
``spawn`` puts it in a new session (its own process group), ``stop`` sends
SIGTERM to that group and SIGKILL after a deadline, ``run`` is a one-shot
command with a deadline. Only process groups these helpers created are
signalled, by their id; nothing is looked up by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, **kw)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    # p.pid is the group id (start_new_session). While p is not reaped its pid
    # cannot be reused, so the group is still ours.
    if p.returncode is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def stop(p: subprocess.Popen, timeout_s: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """End ``p``'s process group: ``sig``, then SIGKILL if it is not gone within ``timeout_s``."""
    _signal_group(p, sig)
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(p, signal.SIGKILL)
        return p.wait(timeout=timeout_s)


def kill(p: subprocess.Popen) -> None:
    """SIGKILL the group and reap: for a process that must stop now (e.g. a flood)."""
    _signal_group(p, signal.SIGKILL)
    p.wait(timeout=30)


@contextmanager
def running(argv: list[str], stop_timeout_s: float = 10.0, **kw):
    """``spawn`` for the duration of a ``with`` block; the group is stopped on the way out, however it ends."""
    p = spawn(argv, **kw)
    try:
        yield p
    finally:
        stop(p, stop_timeout_s)


def run(argv: list[str], timeout_s: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """One command with a deadline; on timeout its whole group is killed and TimeoutExpired raised."""
    p = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(p, signal.SIGKILL)
        p.communicate()
        raise
    finally:
        if p.returncode is None:  # interrupted some other way (KeyboardInterrupt): never leave it running
            _signal_group(p, signal.SIGKILL)
            p.wait()
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)[:200]} exited {p.returncode}: {err[-2000:]}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)
