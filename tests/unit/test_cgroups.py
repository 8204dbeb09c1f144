"""cgroup v2 lookups under injectable roots: a tenants file names cgroups as the host sees them."""

from __future__ import annotations

import os

from shaperd.core.roots import Roots
from shaperd.discovery import cgroups


def _tree(tmp_path):
    roots = Roots.of(sys=str(tmp_path / "sys"), proc=str(tmp_path / "proc"))
    (tmp_path / "sys" / "fs" / "cgroup" / "tenant-a.slice" / "job.scope").mkdir(parents=True)
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n")
    return roots


def test_an_absolute_host_path_is_looked_up_under_the_sysfs_root(tmp_path):
    roots = _tree(tmp_path)
    root = cgroups.cgroup2_root(roots)
    assert root == tmp_path / "sys" / "fs" / "cgroup"
    r = cgroups.ref(root, "/sys/fs/cgroup/tenant-a.slice/job.scope", roots)
    assert r is not None and r.path == "/sys/fs/cgroup/tenant-a.slice/job.scope"  # named as the tenants file says
    assert (r.level, r.id) == (2, os.stat(root / "tenant-a.slice" / "job.scope").st_ino)
    # relative to the cgroup2 root: the same directory
    assert cgroups.ref(root, "tenant-a.slice/job.scope", roots).id == r.id


def test_a_path_outside_the_cgroup2_mount_or_missing_is_none(tmp_path):
    roots = _tree(tmp_path)
    root = cgroups.cgroup2_root(roots)
    assert cgroups.ref(root, "/sys/fs/cgroup/absent.slice", roots) is None
    assert cgroups.ref(root, "/proc/self", roots) is None
