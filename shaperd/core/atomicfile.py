"""Write a file atomically: a reader sees the old content or the new, never part of either.

The one way shaperd writes files it keeps for others (the per-tenant NCCL env
files, the VF-rate and refusal records) and files it edits on an operator's
behalf (OpenSM's options file): a temporary file in the same directory,
written, given its mode (and, for a file edited in place, the old file's
owner), fsynced, renamed over the target, then the directory fsynced so the
rename itself is durable. The temporary file is removed if anything fails.

A failure is an ``AtomicWriteError``: an OSError of the cause's class, errno
and strerror, whose text says which step failed ("write /etc/x: No space left
on device"), so callers that catch FileNotFoundError or read ``e.strerror``
are unchanged and callers that print the error name the file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class AtomicWriteError(OSError):
    """One step of an atomic write failed: ``action`` names it ("write /etc/opensm/opensm.conf").

    Raised as a subclass that is also the cause's own OSError class (FileNotFoundError,
    PermissionError ...), so ``except FileNotFoundError`` around a write still sees a missing
    directory."""

    action: str

    def __str__(self) -> str:
        return f"{self.action}: {self.strerror}"


_ERRORS: dict[type, type] = {OSError: AtomicWriteError}


def _failed(action: str, cause: OSError) -> AtomicWriteError:
    kind = type(cause)
    cls = _ERRORS.get(kind)
    if cls is None:
        cls = _ERRORS[kind] = type(f"AtomicWrite{kind.__name__}", (AtomicWriteError, kind), {})
    err = cls(cause.errno, cause.strerror or str(cause))
    err.action = action
    return err


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, edit: bool = False) -> Path:
    """Replace ``path`` with ``data``; returns the path written.

    ``mode``: the new file's permission bits. ``edit``: the file is an operator's (a config file
    shaperd edits): a symlink is followed and its target replaced, and an existing file keeps its
    mode and owner (``mode`` then applies only to a file that did not exist; the owner is kept only
    where this process may chown, as an editor would leave it)."""
    target = Path(os.path.realpath(path)) if edit else path
    old = _stat(target) if edit else None
    import tempfile  # here, not at the top: this module's readers (status reads the label files) never write

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _failed(f"create a temporary file in {target.parent}", e) from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            # mkstemp makes it 0600
            os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode) if old is not None else mode)
            if old is not None:
                with contextlib.suppress(PermissionError):  # not root: the file becomes ours
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        _unlink(tmp)
        raise _failed(f"write {target}", e) from e
    except BaseException:
        _unlink(tmp)
        raise
    try:
        fsync_dir(target.parent)
    except OSError as e:
        raise _failed(f"fsync directory {target.parent} after replacing {target.name}", e) from e
    return target


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _failed(f"stat {path}", e) from e


def _unlink(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
