"""The RDMA backend: the protocol's steps for the per-tenant NCCL env files under the run directory.

Owns ``<run>/shaperd/nccl/<tenant>.env`` files that carry shaperd's header
(envfiles.py says what is shaperd's); never touches anything else in that
directory. observe reads the files, diff (pure) compares bytes, apply writes
or deletes with one helper (shaperd/core/atomicfile.py). File writes are not
netlink, so they live here rather than under kernel/. Later RDMA work (the
SM-table check, counters, VF rates) adds its targets here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shaperd.core.atomicfile import write_atomic
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.core.roots import DEFAULT, Roots
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.backends.nccl import envfiles
from shaperd.rdma import plan as rdma_plan
from shaperd.backends.nccl.diff import diff as diff_files
from shaperd.backends.nccl.envfiles import EnvObserved, NcclFiles
from shaperd.backends.nccl.ops import DeleteEnvFile, WriteEnvFile

# shaperd's env files are a few hundred bytes; anything larger with one of its names is not its.
MAX_FILE_BYTES = 64 * 1024


class NotOurs(Exception):
    pass


class RdmaBackend:
    name = "rdma"
    # What may be left where a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "shaperd's NCCL env files"

    def __init__(self, roots: Roots = DEFAULT):
        self.directory = roots.run.joinpath(*envfiles.SUBDIR)

    def probe(self, caps: Capabilities) -> Support:
        return Support(True)

    def plan(self, ctx: PlanInput) -> NcclFiles:
        p = rdma_plan.plan(ctx.config, ctx.inventory, ctx.tenancy)
        return envfiles.wanted(ctx.config, ctx.inventory, p)

    def observe(self, reads, inv: Inventory) -> EnvObserved:
        where = str(self.directory)
        files: dict[str, bytes] = {}
        foreign: set[str] = set()
        try:
            with os.scandir(self.directory) as it:
                entries = list(it)
        except FileNotFoundError:
            return EnvObserved(where)
        except OSError as e:
            return EnvObserved(where, error=f"read directory {where}: {e.strerror or e}")
        for entry in entries:
            if envfiles.tenant_of(entry.name) is None:
                continue  # not a name shaperd writes: not looked at
            content = _read_owned(Path(entry.path))
            if content is None:
                foreign.add(entry.name)
            else:
                files[entry.name] = content
        return EnvObserved(where, files, frozenset(foreign))

    def diff(self, desired: NcclFiles, observed: EnvObserved) -> list[TargetDiff]:
        return [diff_files(desired, observed)]

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        res = ApplyResult()  # one file at a time: there is no batch to fail part-way
        for op in diff.ops:
            try:
                if isinstance(op, WriteEnvFile):
                    self._write(op)
                elif isinstance(op, DeleteEnvFile):
                    self._delete(op)
                else:  # pragma: no cover - diff makes no other kind
                    raise NotOurs(f"unknown operation {type(op).__name__}")
            except FileNotFoundError:
                if op.deletes:
                    res.applied.append(op)  # already gone: the goal is reached
                else:
                    res.failed.append((op, op.error(f"directory {self.directory} is gone")))
            except OSError as e:
                res.failed.append((op, op.error(e.strerror or str(e), e.errno)))
            except NotOurs as e:
                res.failed.append((op, op.error(str(e))))
            else:
                res.applied.append(op)
        return res

    def _write(self, op: WriteEnvFile) -> None:
        path = self.directory / op.file.name
        self._check_ours(path)
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        write_atomic(path, op.file.content, 0o644)

    def _delete(self, op: DeleteEnvFile) -> None:
        path = self.directory / op.name
        self._check_ours(path)
        os.unlink(path)

    def _check_ours(self, path: Path) -> None:
        """Between observe and apply someone may have put their own file there: then it stays."""
        if _read_owned(path) is None and os.path.lexists(path):
            raise NotOurs("not shaperd's file (no shaperd header, or not a regular file): left alone")

    def teardown(self, observed: EnvObserved) -> list[TargetDiff]:
        return [diff_files(NcclFiles(), observed)]

    def stats(self, desired: NcclFiles) -> BackendStats:
        return BackendStats()  # env files enforce nothing by themselves: RDMA counters come later


def _read_owned(path: Path) -> bytes | None:
    """The file's bytes when it is shaperd's (a regular file, not a symlink, with its header), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # a symlink (ELOOP), unreadable, or gone
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1 - len(data))):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES or not envfiles.owned(path.name, data.split(b"\n", 1)[0]):
        return None
    return data
