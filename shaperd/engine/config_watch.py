"""When the daemon (re)reads its tenants file, and reading it without tearing.

Owns: the file's stamp (inode, device, mtime, size, through the symlink, so a
ConfigMap's atomic ``..data`` swap is a change), the settle time before a
changed file is read (an editor or ``kubectl cp`` writing in place is not
read half-way), the torn-read check (the stamp before and after the read
must agree, else the read is discarded and retried), a digest of the last
bytes read (an unchanged file is not parsed or logged again), and the
"racy stamp" re-check: a file modified less than ``racy_s`` before it was
read may be rewritten again with the same size inside the kernel's coarse
timestamp tick, so its bytes are compared once more on later polls (git's
racy-index rule).
Must not: parse or judge the file (config.py), or touch the kernel.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from shaperd.core.config import limits as config_limits
from shaperd.core.errors import ConfigError, ConfigProblem

# A changed stamp must hold this long before the file is read...
SETTLE_S = 0.25
# ...but a file rewritten without pause is read after this long anyway (last seen wins).
MAX_DEFER_S = 3.0
# Stamps this young may hide a same-size rewrite (mtime granularity is a timer tick, not 1 ns).
RACY_S = 2.0


@dataclass(frozen=True)
class FileStamp:
    ino: int
    dev: int
    mtime_ns: int
    size: int


def stamp(path: str) -> FileStamp | None:
    try:
        st = os.stat(path)  # follows symlinks: a swapped target is a new inode
    except OSError:
        return None
    return FileStamp(st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class Read:
    """One read: ``text`` (new bytes, decoded), ``error`` (unreadable: a typed ConfigError), or neither
    (``torn``: changed while read, retry; else the same bytes as last time)."""

    text: str | None = None
    error: ConfigError | None = None
    torn: bool = False

    @property
    def new(self) -> bool:
        return self.text is not None or self.error is not None


class ConfigWatch:
    def __init__(self, path: str, settle_s: float = SETTLE_S, max_defer_s: float = MAX_DEFER_S,
                 racy_s: float = RACY_S, wall=time.time):
        self.path = path
        self.settle_s, self.max_defer_s, self.racy_s = settle_s, max_defer_s, racy_s
        self.wall = wall
        self.read_stamp: FileStamp | None = None  # the stamp of the last complete read
        self.digest: bytes | None = None
        self.racy = False
        self.pending: tuple[FileStamp | None, float] | None = None  # (stamp seen, first seen at)
        self.torn_reads = 0

    def due(self, now: float) -> bool:
        """On a poll tick: whether to read the file now."""
        s = stamp(self.path)
        if self.pending is not None:
            seen, first = self.pending
            if s == seen or now - first >= self.max_defer_s:
                self.pending = None
                return True
            self.pending = (s, first)  # still changing: wait for it to settle
            return False
        if s != self.read_stamp:
            self.pending = (s, now)
            return False
        return self.racy

    def poll_interval_s(self, idle_s: float) -> float:
        """How long until the next poll: the settle time while a change is pending."""
        return self.settle_s if self.pending is not None else idle_s

    def read(self, force: bool = False) -> Read:
        """Read the file if its bytes are new (or *force*: SIGHUP re-reads even the same bytes)."""
        before = stamp(self.path)
        try:
            data = config_limits.read_capped(self.path)
        except OSError as e:
            after = stamp(self.path)
            if before != after:
                return self._torn()
            self._record(before, None)
            return Read(error=ConfigError(self.path, [ConfigProblem("", f"cannot read file: {e.strerror or e}")]))
        except ConfigError as e:  # over the size cap
            self._record(before, None)
            return Read(error=e)
        if stamp(self.path) != before:
            return self._torn()
        digest = hashlib.sha256(data).digest()
        same = digest == self.digest
        self._record(before, digest)
        if same and not force:
            return Read()
        try:
            return Read(text=data.decode("utf-8"))
        except UnicodeDecodeError as e:
            return Read(error=ConfigError(self.path, [ConfigProblem("", f"not UTF-8 text: {e}")]))

    def _torn(self) -> Read:
        self.torn_reads += 1
        self.read_stamp = None  # the next poll sees a change, waits for it to settle and reads again
        return Read(torn=True)

    def _record(self, s: FileStamp | None, digest: bytes | None) -> None:
        self.read_stamp = s
        self.digest = digest
        self.racy = s is not None and self.wall() - s.mtime_ns / 1e9 < self.racy_s
