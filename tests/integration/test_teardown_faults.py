"""Teardown on a real kernel (fresh namespaces): it fails where it cannot read.

- The class dump of one uplink never answers (the fault seam's read_silent on RTM_GETTCLASS): the
  CLI's teardown exits 1 and names the device and what may remain; the other uplink is torn down.
  The kernel state is read back through netlink: what was said to remain does remain, the rest
  is gone, and a second teardown without the fault finishes the job.
- A pod interface whose clsact ingress cannot be read fails the marks backend's teardown there.

The backends this host cannot run on a veth (edt without sch_fq, devlink, DCB, VF rates) are
covered with fakes in tests/unit/test_teardown_faults.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import structlog

from shaperd.backends.marks.backend import MarksBackend
from shaperd.backends.marks.objects import TARGET, TC_H_INGRESS_PARENT, MarkFilter
from shaperd.backends.marks.ops import AddClsact, SetMark
from shaperd.cli import main as cli
from shaperd.core.ids import bpf_program_name
from shaperd.core.protocol import TargetDiff
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import faults, tc
from shaperd.kernel.probe import probe_capabilities
from shaperd.kernel.rtnl import RTM_GETTCLASS, RTM_GETTFILTER, RtnlReader
from shaperd_bed import netns

from .conftest import needs_root
from .test_core import write

pytestmark = needs_root

CFG = """
node: {interfaces: [up0, up2], capacity: 10Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 4Gbps, bandwidthLimit: 6Gbps, priority: 100,
     match: {cidrs: [198.18.8.0/24, 198.18.9.7/32]}}
  - {name: tenant-b, bandwidthGuarantee: 2Gbps, priority: 50, match: {cidrs: [198.18.10.0/24]}}
"""


@pytest.fixture
def node(bed):
    netns.veth("up2", bed.node, "up3", bed.node)
    reader = RtnlReader(bed.node, timeout_s=1.0)
    try:
        yield bed, reader, {l.name: l.ifindex for l in reader.links()}
    finally:
        reader.close()


@pytest.fixture
def cli_here(capsys):
    """``shaperd`` in this process (so the fault seam reaches it); its log set-up undone afterwards (it
    writes to the captured stderr, which is closed once the test ends)."""
    try:
        yield lambda *argv: cli.main(list(argv))
    finally:
        structlog.reset_defaults()


def qdiscs(reader, ifindex):
    """(kind, handle major) of every qdisc on the device, read back through netlink."""
    return sorted((q.kind, q.handle >> 16) for q in reader.qdiscs() if q.ifindex == ifindex)


HOOKS = (TC_H_INGRESS_PARENT, TC_H_INGRESS_PARENT + 1)  # clsact ingress, egress


def shaperd_state(reader, ifindex, device):
    return {"qdiscs": qdiscs(reader, ifindex), "classes": len(reader.htb_classes(ifindex, device)),
            "clsact_filters": sorted((f.parent, f.kind, f.prio) for hook in HOOKS
                                     for f in reader.filters(ifindex, hook, device))}


def applied(bed, tmp_path, reader, idx):
    r = bed.shaperd("apply", "--config", str(write(tmp_path, CFG)))
    assert r.returncode == 0, r.stderr
    for dev in ("up0", "up2"):
        st = shaperd_state(reader, idx[dev], dev)
        assert ("htb", 0x7368) in st["qdiscs"] and st["classes"] >= 3, st
    return {dev: shaperd_state(reader, idx[dev], dev) for dev in ("up0", "up2")}


def test_teardown_under_an_unreadable_class_dump_exits_1_naming_the_device(node, tmp_path, capsys, cli_here):
    bed, reader, idx = node
    before = applied(bed, tmp_path, reader, idx)
    plan = faults.FaultPlan()
    plan.read_silent(msg_type=RTM_GETTCLASS, ifindex=idx["up0"])
    with faults.installed(plan):
        code = cli_here("teardown", "--netns", bed.node)
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert plan.fired >= 1
    assert ("teardown htb on up0: could not read it (read classes on up0: no answer from the kernel within 5 s): "
            "its root qdisc 7368: with its classes, leaves and filters, and its map classifier may remain") in err, err
    assert "teardown incomplete: 1 target(s) not torn down (htb on up0)" in err, err
    # What it said may remain does: up0's root and classes; up2 is torn down.
    up0 = shaperd_state(reader, idx["up0"], "up0")
    assert ("htb", 0x7368) in up0["qdiscs"] and up0["classes"] == before["up0"]["classes"], up0
    up2 = shaperd_state(reader, idx["up2"], "up2")
    assert ("htb", 0x7368) not in up2["qdiscs"] and up2["classes"] == 0 and up2["clsact_filters"] == [], up2
    # Without the fault the next teardown finishes: nothing of shaperd's on either device.
    assert cli_here("teardown", "--netns", bed.node) == 0, capsys.readouterr()
    for dev in ("up0", "up2"):
        st = shaperd_state(reader, idx[dev], dev)
        assert ("htb", 0x7368) not in st["qdiscs"] and st["classes"] == 0 and st["clsact_filters"] == [], (dev, st)


def test_marks_an_unreadable_pod_interface_fails_the_teardown_and_keeps_its_program(node):
    bed, reader, idx = node
    netns.veth("pa-1", bed.node, "pa-2", bed.node)
    pod = {l.name: l.ifindex for l in reader.links()}["pa-1"]
    writer = tc.open_writer(bed.node)
    writer.nl.timeout_s = 1.0
    try:
        mark = MarkFilter(pod, "pa-1", 0x10000, 0xFF0000, bpf_program_name(((0x10000, 0xFF0000),), "mark"), "t")
        res = MarksBackend(writer).apply(TargetDiff(TARGET, [AddClsact(device="pa-1", ifindex=pod),
                                                            SetMark(device="pa-1", ifindex=pod, mark=mark)]))
        assert not res.failed and res.applied, res.failed
        caps = dataclasses.replace(probe_capabilities(), bpf_maps=False)
        rec = Reconciler(reader, default_backends(writer), caps)
        plan = faults.FaultPlan()
        plan.read_silent(msg_type=RTM_GETTFILTER, ifindex=pod, parent=TC_H_INGRESS_PARENT)
        with faults.installed(plan):
            rep = rec.teardown()
        assert not rep.ok
        errors = {(d.backend, d.device): d.error for d in rep.devices if d.error}
        assert errors[("marks", "pa-1")] == (
            "teardown marks on pa-1: could not read it (read filters on pa-1: no answer from the kernel within "
            "1 s): its mark program on clsact ingress may remain"), errors
        assert set(errors) == {("marks", "pa-1")}, errors  # nothing else failed
        assert [f.name for f in reader.filters(pod, TC_H_INGRESS_PARENT, "pa-1")] == [mark.name]  # it did remain
        rep = rec.teardown()
        assert rep.ok, [d.error for d in rep.devices]
        assert reader.filters(pod, TC_H_INGRESS_PARENT, "pa-1") == []
    finally:
        writer.close()
