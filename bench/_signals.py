"""Signal handling shared by the benchmarks that fork through pyroute2."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager


@contextmanager
def sigterm_as_exit():
    """SIGTERM/SIGHUP end the benchmark through its cleanup (SystemExit), in this process only.

    pyroute2 forks helper children (netns sockets) that inherit the handler and
    are stopped with SIGTERM: a child must just exit, not unwind the parent's
    copied stack into its cleanup.
    """
    owner = os.getpid()

    def handler(signum, _frame):
        if os.getpid() != owner:
            os._exit(0)
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
