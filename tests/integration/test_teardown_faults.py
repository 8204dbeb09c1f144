"""Teardown on a real kernel (fresh namespaces): it fails where it cannot read, and leaves no clsact of its own.

- The class dump of one uplink never answers (the fault seam's read_silent on RTM_GETTCLASS): the
  CLI's teardown exits 1 and names the device and what may remain; the other uplink is torn down.
  The kernel state is read back through netlink: what was said to remain does remain, the rest
  is gone, and a second teardown without the fault finishes the job.
- A clean teardown leaves no htb root and no clsact that shaperd added (qdiscs dumped afterwards);
  a clsact that also holds another's filter stays, with that filter, and is reported in one line.
- A pod interface whose clsact ingress cannot be read fails the marks backend's teardown there.

The backends this host cannot run on a veth (edt without sch_fq, devlink, DCB, VF rates) are
covered with fakes in tests/unit/test_teardown_faults.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import structlog

from shaperd.backends.common import clsact
from shaperd.backends.marks.backend import MarksBackend
from shaperd.backends.marks.objects import TARGET, MarkFilter
from shaperd.backends.marks.ops import AddClsact, SetMark
from shaperd.cli import main as cli
from shaperd.core.ids import bpf_program_name
from shaperd.core.protocol import TargetDiff
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import faults, tc
from shaperd.engine.probe import probe_capabilities
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


def shaperd_state(reader, ifindex, device):
    return {"qdiscs": qdiscs(reader, ifindex), "classes": len(reader.htb_classes(ifindex, device)),
            "clsact_filters": sorted((f.parent, f.kind, f.prio) for hook in (clsact.INGRESS, clsact.EGRESS)
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
    # What it said may remain does: up0's root and classes; up2 is torn down, htb and clsact both gone.
    up0 = shaperd_state(reader, idx["up0"], "up0")
    assert ("htb", 0x7368) in up0["qdiscs"] and up0["classes"] == before["up0"]["classes"], up0
    assert shaperd_state(reader, idx["up2"], "up2") == {"qdiscs": [("noqueue", 0)], "classes": 0,
                                                        "clsact_filters": []}
    # Without the fault the next teardown finishes: nothing of shaperd's on either device.
    assert cli_here("teardown", "--netns", bed.node) == 0, capsys.readouterr()
    for dev in ("up0", "up2"):
        assert shaperd_state(reader, idx[dev], dev) == {"qdiscs": [("noqueue", 0)], "classes": 0,
                                                        "clsact_filters": []}, dev


def test_a_clean_teardown_leaves_no_htb_and_no_clsact_shaperd_added(node, tmp_path):
    bed, reader, idx = node
    before = applied(bed, tmp_path, reader, idx)
    if ("clsact", 0xFFFF) not in before["up0"]["qdiscs"]:
        pytest.skip("no eBPF map classifier on this kernel: shaperd adds no clsact on the uplinks")
    r = bed.shaperd("teardown")
    assert r.returncode == 0, r.stderr
    assert "delete clsact qdisc on up0" in r.stdout and "delete clsact qdisc on up2" in r.stdout, r.stdout
    for dev in ("up0", "up2"):  # dumped afterwards: the veths' own default, nothing else
        assert qdiscs(reader, idx[dev]) == [("noqueue", 0)], dev
    r = bed.shaperd("teardown")
    assert r.returncode == 0 and "0 changed" in r.stdout, (r.stdout, r.stderr)


def test_a_clsact_with_anothers_filter_stays_with_it_and_is_said_once(node, tmp_path):
    bed, reader, idx = node
    before = applied(bed, tmp_path, reader, idx)
    if ("clsact", 0xFFFF) not in before["up0"]["qdiscs"]:
        pytest.skip("no eBPF map classifier on this kernel: shaperd adds no clsact on the uplinks")
    # another agent's filter on the clsact shaperd shares
    bed.exec("tc", "filter", "add", "dev", "up0", "ingress", "prio", "7", "u32", "match", "u32", "0", "0",
             "flowid", "1:2")
    r = bed.shaperd("teardown")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stdout.splitlines() if "left in place" in line]
    assert notes == ["clsact qdisc on up0 left in place: it holds filters that are not shaperd's "
                     "(ingress u32 prio 7)"], r.stdout
    up0 = shaperd_state(reader, idx["up0"], "up0")
    assert up0 == {"qdiscs": [("clsact", 0xFFFF), ("noqueue", 0)], "classes": 0,
                   "clsact_filters": [(clsact.INGRESS, "u32", 7)]}, up0
    assert qdiscs(reader, idx["up2"]) == [("noqueue", 0)]


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
        plan.read_silent(msg_type=RTM_GETTFILTER, ifindex=pod, parent=clsact.INGRESS)
        with faults.installed(plan):
            rep = rec.teardown()
        assert not rep.ok
        errors = {(d.backend, d.device): d.error for d in rep.devices if d.error}
        assert errors[("marks", "pa-1")] == (
            "teardown marks on pa-1: could not read it (read filters on pa-1: no answer from the kernel within "
            "1 s): its mark program on clsact ingress may remain"), errors
        # Nothing else failed: the tenant-ingress backend's teardown also reads every clsact's ingress filters
        # (its redirect may sit on a device that is no longer an uplink), so it says the same of pa-1.
        assert set(errors) <= {("marks", "pa-1"), ("clsact", "pa-1"), ("ingress", "pa-1")}, errors
        assert [f.name for f in reader.filters(pod, clsact.INGRESS, "pa-1")] == [mark.name]  # it did remain
        rep = rec.teardown()
        assert rep.ok, [d.error for d in rep.devices]
        assert qdiscs(reader, pod) == [("noqueue", 0)]  # the program and then its clsact went
    finally:
        writer.close()
