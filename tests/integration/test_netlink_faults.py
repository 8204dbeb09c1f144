"""Netlink faults injected at the kernel boundary (kernel/faults.py), on one of two shaped devices.

Each fault hits up0 only; up2 is shaped from the same tenants file and is
the reference: after the fault clears, up0's tree (read back through
netlink) must equal up2's, i.e. what a fresh apply gives. Every error must
read "verb object on device: cause", and up2 must be enforced throughout.
"""

from __future__ import annotations

import dataclasses
import errno

import pytest

from shaperd.core.config import load_text
from shaperd.engine.reconciler import Reconciler, default_backends
from shaperd.kernel import faults, tc
from shaperd.engine.probe import probe_capabilities
from shaperd.kernel.rtnl import RTM_GETTCLASS, RtnlReader
from shaperd_bed import netns

from ..tc_state import snapshot
from .conftest import needs_root

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
    # The u32 path (the bounded writer's bulk); the eBPF map classifier's entries are bpf maps, not tc.
    caps = dataclasses.replace(probe_capabilities(), bpf_maps=False)
    writer, reader = tc.open_writer(bed.node), RtnlReader(bed.node, timeout_s=1.0)
    writer.nl.timeout_s = 1.0  # a silent kernel costs 1 s here, not the production 5 s
    rec = Reconciler(reader, default_backends(writer), caps)
    idx = {l.name: l.ifindex for l in reader.links()}
    try:
        yield rec, reader, idx, load_text(CFG)
    finally:
        writer.close()
        reader.close()


def htb(rep, device):
    return next(d for d in rep.devices if d.backend == "htb" and d.device == device)


def assert_matches_fresh(reader, idx):
    up0, up2 = snapshot(reader, idx["up0"], "up0"), snapshot(reader, idx["up2"], "up2")
    assert up2["classes"] and up2["filter_count"] == 4  # the bpf classifier and three u32 prefixes
    assert up0 == up2


@pytest.mark.parametrize("code, transient", [(errno.EPERM, False), (errno.EINVAL, False),
                                             (errno.EBUSY, True), (errno.ENOBUFS, True)])
def test_a_refused_write_names_object_and_device_and_spares_the_other_device(node, code, transient):
    rec, reader, idx, cfg = node
    plan = faults.FaultPlan()
    plan.refuse(code, ifindex=idx["up0"], times=1 if transient else 1 << 30)
    with faults.installed(plan):
        rep = rec.apply(cfg)
    assert not htb(rep, "up2").failed and htb(rep, "up2").ops  # the other device was shaped
    out = htb(rep, "up0")
    if transient:
        # The batch failed, was re-read and replayed one by one: the retry got through.
        assert not out.failed and plan.fired == 1
    else:
        assert out.failed
        msg = str(out.failed[0][1])
        assert msg.startswith("create root qdisc htb 7368: on up0: ") and "injected" in msg, msg
        assert not out.failed[0][1].transient
        assert plan.fired >= 2  # the batch, then the replay: never asked again with backoff
    assert rec.apply(cfg).changes == (0 if transient else len(out.failed))  # the second reconcile repairs
    assert rec.apply(cfg).changes == 0
    assert_matches_fresh(reader, idx)


def test_a_write_without_an_answer_is_a_deadline_error_and_the_next_reconcile_repairs(node):
    rec, reader, idx, cfg = node
    plan = faults.FaultPlan()
    plan.no_answer(ifindex=idx["up0"], times=1)
    with faults.installed(plan):
        rep = rec.apply(cfg)
    out = htb(rep, "up0")
    assert out.failed and plan.fired == 1
    first = str(out.failed[0][1])
    assert first.startswith("create root qdisc htb 7368: on up0: no answer within 1 s"), first
    assert all(e.transient for _op, e in out.failed)
    assert not htb(rep, "up2").failed
    rec.apply(cfg)  # the daemon's backoff retry: re-read (the write had landed), diff, write the rest
    assert rec.apply(cfg).changes == 0
    assert_matches_fresh(reader, idx)


def test_an_interrupted_dump_is_read_again(node):
    rec, reader, idx, cfg = node
    rec.apply(cfg)
    plan = faults.FaultPlan()
    plan.dump_interrupted(msg_type=RTM_GETTCLASS, times=2)
    with faults.installed(plan):
        rep = rec.apply(cfg)
    assert plan.fired == 2 and rep.ok and rep.changes == 0
    assert_matches_fresh(reader, idx)


def test_a_dump_interrupted_every_time_is_a_device_error_not_a_wrong_tree(node):
    rec, reader, idx, cfg = node
    rec.apply(cfg)
    plan = faults.FaultPlan()
    plan.dump_interrupted(msg_type=RTM_GETTCLASS, ifindex=idx["up0"])
    with faults.installed(plan):
        rep = rec.apply(cfg)
    err = htb(rep, "up0").error
    assert err == "dump classes on up0: interrupted 4 times in a row (the table kept changing)", err
    assert htb(rep, "up0").ops == [] and not htb(rep, "up2").error
    assert_matches_fresh(reader, idx)
