"""The exception hierarchy at each boundary shaperd crosses.

One class per boundary (config file, kernel/netlink, discovery of the node)
so callers can decide per kind: bad config is permanent until the file
changes, a kernel error on one device must not stop the others, discovery
errors are retried on the next resync. Messages read "verb object on device:
cause" or "field.path: what was expected".
"""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass

# Kernel answers that say "not now", not "no": worth asking again after a pause. A timeout is one too
# (the next reconcile re-reads first, so a write that landed without an answer is not repeated blindly).
TRANSIENT_ERRNOS = frozenset({_errno.EBUSY, _errno.ENOBUFS, _errno.EAGAIN, _errno.EINTR, _errno.ENOMEM,
                              _errno.ETIMEDOUT, _errno.EPIPE})


class ShaperdError(Exception):
    """Base of every error shaperd reports to an operator (never a traceback)."""


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a tenants file: where (field path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ShaperdError):
    """The tenants file is unusable; carries every problem found, not just the first."""

    def __init__(self, source: str, problems: list[ConfigProblem]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid tenants file {source}: {len(self.problems)} problem(s)\n{lines}")


class KernelError(ShaperdError):
    """A netlink request failed: 'verb object on device: cause'."""

    def __init__(self, verb: str, obj: str, device: str, cause: str, errno: int | None = None):
        self.verb, self.obj, self.device, self.cause, self.errno = verb, obj, device, cause, errno
        super().__init__(f"{verb} {obj} on {device}: {cause}")

    @property
    def transient(self) -> bool:
        """Worth retrying with backoff (EBUSY, ENOBUFS, a timeout ...); False for EPERM, EINVAL and the like."""
        return self.errno in TRANSIENT_ERRNOS


class DiscoveryError(ShaperdError):
    """What is on the node could not be read (a link, sysfs, a route, the pods from the Kubernetes API).

    Raised as its subclasses in discovery/kubernetes/errors.py.
    """
