"""Diff the wanted NCCL env files against the files found, pure.

Write a file that is missing or whose bytes differ; delete shaperd's files
that no tenant wants any more; leave a ``<tenant>.env`` that is not shaperd's
alone, and say so (that tenant then has no env file on this node). An
in-sync directory gives no operation.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.backends.nccl.envfiles import EnvObserved, NcclFiles, tenant_of
from shaperd.backends.nccl.ops import DeleteEnvFile, WriteEnvFile


def diff(desired: NcclFiles, observed: EnvObserved) -> TargetDiff:
    where = observed.directory
    out = TargetDiff(where)
    if observed.error is not None:
        out.error = observed.error
        return out
    want = {f.name: f for f in desired.files}
    blocked = []
    for name, f in sorted(want.items()):
        if name in observed.foreign:
            blocked.append(f"{name} is not shaperd's (no shaperd header): left alone, so tenant {f.tenant} "
                           "has no NCCL env file here")
            continue
        have = observed.files.get(name)
        if have == f.content:
            continue
        why = "missing" if have is None else "changed " + ", ".join(changed_names(have, f.content))
        out.ops.append(WriteEnvFile(device=where, ifindex=0, tenant=f.tenant, file=f, reason=why))
    for name in sorted(observed.files):
        if name not in want:
            out.ops.append(DeleteEnvFile(device=where, ifindex=0, tenant=tenant_of(name), name=name,
                                         reason="stale: no tenant of the tenants file wants it on this node"))
    if blocked:
        out.blocked = "; ".join(blocked)
    return out


def changed_names(old: bytes, new: bytes) -> list[str]:
    """The variables whose lines differ (or 'notes' for comment lines), for the log line."""
    a, b = set(old.splitlines()), set(new.splitlines())
    names = []
    for line in sorted(a ^ b, key=lambda l: (l.startswith(b"#"), l)):  # variables first, then notes
        name = "notes" if line.startswith(b"#") else line.split(b"=", 1)[0].decode(errors="replace")
        if name not in names:
            names.append(name)
    return names or ["content"]
