"""The RDMA backend's NCCL env files under a tmp run root: written atomically, in-sync writes nothing,
stale files of shaperd's go, files that are not shaperd's are never touched.

Driven through the generic reconciler (discovery on a fixture sysfs tree, a
fake rtnetlink reader), and through the backend's steps directly where a
race between observe and apply is staged.
"""

from __future__ import annotations

import os
import stat

import pytest

from shaperd.core import config
from shaperd.core.protocol import PlanInput
from shaperd.backends.nccl import envfiles
from shaperd.rdma import nccl
from shaperd.backends.nccl.backend import RdmaBackend
from shaperd.backends.nccl.ops import DeleteEnvFile, WriteEnvFile
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.core.inventory import Capabilities
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node
from .test_engine import FakeReader

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_1:1"], nccl: {NCCL_IB_TIMEOUT: "22"}}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
"""


@pytest.fixture
def rig(tmp_path):
    node = Node(tmp_path).build()
    roots = Roots.of(sys=str(node.sys), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))
    backend = RdmaBackend(roots)
    rec = Reconciler(FakeReader(), [backend], Capabilities(), roots=roots)

    class Rig:
        dir = tmp_path / "run" / "shaperd" / "nccl"

        def apply(self, text=CFG):
            return rec.apply(config.load_text(text))

        def files(self):
            return sorted(p.name for p in self.dir.iterdir())

    r = Rig()
    r.backend, r.roots, r.rec = backend, roots, rec
    return r


def ops(rep):
    return [op for t in rep.devices for op in t.ops]


def test_first_reconcile_writes_one_file_per_tenant_atomically_with_mode_0644(rig):
    rep = rig.apply()
    assert rep.ok, rep.devices
    assert [(type(o), o.tenant, o.reason) for o in ops(rep)] == [
        (WriteEnvFile, "tenant-a", "missing"), (WriteEnvFile, "tenant-b", "missing")]
    assert ops(rep)[0].describe() == f"write NCCL env file tenant-a.env on {rig.dir} (tenant tenant-a): missing"
    assert rig.files() == ["tenant-a.env", "tenant-b.env"]  # no temporary file left beside them
    a = (rig.dir / "tenant-a.env")
    assert stat.S_IMODE(a.stat().st_mode) == 0o644
    assert a.read_text().splitlines() == [nccl.header("tenant-a"), "NCCL_IB_HCA==mlx5_1:1", "NCCL_IB_SL=0",
                                          "NCCL_IB_TIMEOUT=22"]
    b = (rig.dir / "tenant-b.env").read_text().splitlines()
    assert b[1].startswith("# NCCL_IB_HCA is not set") and b[2:] == ["NCCL_IB_SL=1", "NCCL_IB_TC=98"]


def test_an_in_sync_reconcile_writes_nothing(rig):
    rig.apply()
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in rig.dir.iterdir()}
    rep = rig.apply()
    assert rep.ok and rep.changes == 0
    # An atomic write always makes a new inode: the same inodes prove no file was written.
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in rig.dir.iterdir()} == before


def test_a_changed_setting_rewrites_that_file_only_and_names_the_variable(rig):
    rig.apply()
    ino_b = (rig.dir / "tenant-b.env").stat().st_ino
    rep = rig.apply(CFG.replace('NCCL_IB_TIMEOUT: "22"', 'NCCL_IB_TIMEOUT: "23"'))
    assert [(o.tenant, o.reason) for o in ops(rep)] == [("tenant-a", "changed NCCL_IB_TIMEOUT")]
    assert "NCCL_IB_TIMEOUT=23" in (rig.dir / "tenant-a.env").read_text()
    assert (rig.dir / "tenant-b.env").stat().st_ino == ino_b


def test_a_stale_tenants_file_is_removed_and_what_is_not_shaperds_is_never_touched(rig, tmp_path):
    rig.apply()
    foreign = {
        "notes.txt": b"hello\n",
        "other.env": b"NCCL_IB_HCA=mlx5_0\n",  # a tenant-like name without shaperd's header
        "tenant-b.env.bak": nccl.header("tenant-b").encode() + b"\n",  # the header, but not its name pattern
        "gone.env": nccl.header("tenant-z").encode() + b"\n",  # another tenant's header under this name
    }
    for name, data in foreign.items():
        (rig.dir / name).write_bytes(data)
    elsewhere = tmp_path / "elsewhere.env"
    elsewhere.write_bytes(nccl.header("linked").encode() + b"\n")
    (rig.dir / "linked.env").symlink_to(elsewhere)  # shaperd's content, but a symlink: not its file
    rep = rig.apply(CFG.replace("  - name: tenant-b\n    bandwidthGuarantee: 20Gbps\n    priority: 50\n", ""))
    assert [(type(o), o.what(), o.reason) for o in ops(rep)] == [
        (DeleteEnvFile, "NCCL env file tenant-b.env", "stale: no tenant of the tenants file wants it on this node")]
    assert rig.files() == sorted(["tenant-a.env", "linked.env", *foreign])
    assert {n: (rig.dir / n).read_bytes() for n in foreign} == foreign
    assert (rig.dir / "linked.env").is_symlink() and elsewhere.exists()


def test_a_foreign_file_in_a_tenants_place_is_left_alone_and_reported(rig):
    rig.dir.mkdir(parents=True)
    (rig.dir / "tenant-a.env").write_text("export NCCL_IB_HCA=mine\n")
    rep = rig.apply()
    assert [o.tenant for o in ops(rep)] == ["tenant-b"]
    (t,) = rep.devices
    assert t.blocked == ("tenant-a.env is not shaperd's (no shaperd header): left alone, so tenant tenant-a has "
                         "no NCCL env file here")
    assert (rig.dir / "tenant-a.env").read_text() == "export NCCL_IB_HCA=mine\n"
    assert not rep.ok  # an operator has something to look at


def test_apply_refuses_a_file_that_became_foreign_after_observe(rig):
    cfg = config.load_text(CFG)
    rig.apply()
    b = rig.backend
    inv = rig.rec.inventory(cfg)
    (mine := rig.dir / "tenant-b.env").write_text(nccl.header("tenant-b") + "\nNCCL_IB_SL=9\n")
    (td,) = b.diff(b.plan(PlanInput(cfg, inv, tenancy(cfg, inv))), b.observe(None, inv))
    assert [(o.tenant, o.reason) for o in td.ops] == [("tenant-b", "changed NCCL_IB_SL, NCCL_IB_TC, notes")]
    mine.write_text("mine now\n")  # someone else's, between observe and apply
    res = b.apply(td)
    assert res.applied == [] and [str(e) for _, e in res.failed] == [
        f"write NCCL env file tenant-b.env on {rig.dir}: not shaperd's file (no shaperd header, or not a regular "
        "file): left alone"]
    assert mine.read_text() == "mine now\n"


def test_an_unreadable_directory_is_the_targets_error_and_nothing_is_written(rig):
    rig.roots.run.mkdir(parents=True)
    (rig.roots.run / "shaperd").write_text("not a directory\n")
    rep = rig.apply()
    (t,) = rep.devices
    assert t.error == f"read directory {rig.dir}: Not a directory" and t.ops == [] and not rep.ok


def test_a_failed_write_names_the_file_and_the_cause_and_the_next_reconcile_retries(rig, monkeypatch):
    import errno

    from shaperd.backends.nccl import backend as backend_mod

    def full(path, data, mode):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(backend_mod, "write_atomic", full)
    rep = rig.apply()
    (t,) = rep.devices
    assert [str(e) for _, e in t.failed] == [
        f"write NCCL env file tenant-{x}.env on {rig.dir}: No space left on device" for x in "ab"]
    assert not rep.ok and rig.files() == []
    monkeypatch.undo()
    assert rig.apply().changes == 2 and rig.files() == ["tenant-a.env", "tenant-b.env"]


def test_teardown_removes_only_shaperds_files(rig):
    rig.apply()
    (rig.dir / "keep.env").write_text("mine\n")
    td = rig.rec.teardown()
    assert sorted(o.name for t in td.devices for o in t.ops) == ["tenant-a.env", "tenant-b.env"]
    assert rig.files() == ["keep.env"]
    assert rig.rec.teardown().changes == 0


def test_a_node_without_rdma_writes_files_only_for_tenants_with_an_rdma_section(tmp_path):
    roots = Roots.of(sys=str(tmp_path / "sys"), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))
    rep = Reconciler(FakeReader(), [RdmaBackend(roots)], Capabilities(), roots=roots).apply(config.load_text(CFG))
    assert [o.tenant for o in ops(rep)] == ["tenant-a"]  # tenant-b has no rdma section and this node no device


def test_default_backends_include_the_rdma_backend_at_the_run_root(tmp_path):
    roots = Roots.of(run=str(tmp_path))
    b = next(b for b in default_backends(writer=None, roots=roots) if isinstance(b, RdmaBackend))
    assert b.directory == tmp_path.joinpath(*envfiles.SUBDIR)
    assert os.fspath(b.directory).endswith("shaperd/nccl")
