"""Find cgroup v2 directories: the cgroup2 mount, a pod's cgroup from its UID, configured paths.

The id a BPF program sees (bpf_skb_ancestor_cgroup_id) is the cgroup
directory's inode number on the cgroup2 filesystem; its level is its depth
below the cgroup2 root. Roots (shaperd/core/roots.py) are injectable so tests use their own trees.
"""

from __future__ import annotations

import os
from pathlib import Path

from shaperd.core.inventory import CgroupRef
from shaperd.core.roots import DEFAULT, Roots


def cgroup2_root(roots: Roots = DEFAULT) -> Path | None:
    """Mount point of the cgroup2 hierarchy (unified or hybrid layout) under ``roots``, or None."""
    try:
        lines = roots.mountinfo.read_text().splitlines()
    except OSError:
        return None
    found: list[Path] = []
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            found.append(Path(left.split()[4]))
    # Prefer the conventional places when several are mounted.
    for pref in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if pref in found:
            return roots.host(pref)
    return roots.host(found[0]) if found else None


def ref(root: Path, path: str | Path, roots: Roots = DEFAULT) -> CgroupRef | None:
    """CgroupRef for ``path`` (absolute as the host names it, under ``roots``; or relative to the cgroup2 root)."""
    p = Path(path)
    full = roots.host(p) if p.is_absolute() else root / p
    try:
        rel = full.resolve().relative_to(root.resolve())
        st = os.stat(full)
    except (OSError, ValueError):
        return None
    if not full.is_dir():
        return None
    return CgroupRef(path=str(path), level=len(rel.parts), id=st.st_ino)


def pod_cgroup_candidates(uid: str) -> list[str]:
    """Where kubelet puts a pod's cgroup, for the systemd and cgroupfs drivers and each QoS class."""
    under = uid.replace("-", "_")
    out = [f"kubepods.slice/kubepods-pod{under}.slice"]
    for qos in ("burstable", "besteffort"):
        out.append(f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice")
    out.append(f"kubepods/pod{uid}")
    for qos in ("burstable", "besteffort"):
        out.append(f"kubepods/{qos}/pod{uid}")
    return out


def pod_cgroup(root: Path, uid: str) -> CgroupRef | None:
    for rel in pod_cgroup_candidates(uid):
        r = ref(root, rel)
        if r is not None:
            return r
    return None
