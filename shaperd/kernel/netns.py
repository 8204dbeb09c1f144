"""The one way into a network namespace: create a socket there.

A socket belongs to the namespace it was created in, whatever thread uses it
later. So every netlink socket shaperd opens (pyroute2's writer, the raw
reader, the event socket) is created inside ``entered(name)``, which moves
only the calling thread with setns(2) and always moves it back. Writers,
readers and event sockets of one reconciler therefore cannot end up in
different namespaces (an earlier layout had three mechanisms, and a default
in one of them once read one namespace while writing another).

``name`` None means this process's own namespace: nothing is switched.
Named namespaces live under ``<run>/netns`` (iproute2's convention).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

from shaperd.core.errors import KernelError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def entered(name: str | None, run_root: str = "/run") -> Iterator[None]:
    """Run the body with this thread in namespace ``name`` (None: stay where we are)."""
    if not name:
        yield
        return
    path = os.path.join(run_root, "netns", name)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise KernelError("enter", f"network namespace {name}", path, e.strerror or str(e), e.errno) from e
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _setns(target)
        except OSError as e:
            raise KernelError("enter", f"network namespace {name}", path, e.strerror or str(e), e.errno) from e
        try:
            yield
        finally:
            _setns(here)  # must not fail: we came from there
    finally:
        os.close(here)
        os.close(target)
