"""Teardown under read faults, backend by backend, on fakes: an unreadable target fails the teardown.

Through the generic reconciler's teardown (engine/teardown.py keeps the targets and words the
failures). The kernel side is faked where this host cannot exercise it (devlink, DCB, VF rates
answer a veth with errors; edt needs sch_fq): each fake stands for the backend's reader and raises
what a kernel that does not answer gives (ETIMEDOUT) or what a missing feature gives. Asserted for
every backend: the target whose read failed is reported as failed, by device and with what may
remain, the teardown is not ``ok`` (the CLI's exit 1), and what could be read is still torn down.
The real-kernel side (htb, marks, the clsact qdisc) is tests/integration/test_teardown_faults.py.
"""

from __future__ import annotations

import errno
import struct
from pathlib import Path

from shaperd.backends.common import clsact, mapcls
from shaperd.backends.dcb.backend import DcbBackend
from shaperd.backends.devlink.backend import DevlinkBackend
from shaperd.backends.edt.backend import EdtBackend
from shaperd.backends.edt.objects import PRIO_STAMPER, ROOT_HANDLE as EDT_ROOT
from shaperd.backends.edt.ops import DeleteRoot as EdtDeleteRoot
from shaperd.backends.htb.backend import HtbBackend
from shaperd.backends.htb.ops import DeleteRoot
from shaperd.backends.marks.backend import MarksBackend
from shaperd.backends.marks.objects import PRIO_MARK_INGRESS
from shaperd.backends.nccl.backend import RdmaBackend
from shaperd.backends.vfrate.backend import VfRateBackend
from shaperd.core import config
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities
from shaperd.core.protocol import ApplyResult, TargetDiff
from shaperd.core.roots import Roots
from shaperd.engine import teardown as teardown_mod
from shaperd.engine.reconciler import Reconciler
from shaperd.backends.common.kernel_tc import CODEC as CLSACT_CODEC
from shaperd.kernel import devlink as nl, nlmsg, tc
from shaperd.kernel.rtnl_rows import TC_H_ROOT, FilterRow, LinkRow, QdiscRow

from ..rdma_fixture import Node
from ..strace_dump import sent
from .test_dcb_plan import TWO, FakeDcb, cfg_text
from .test_devlink_backend import FakeDevlink
from .test_engine import FakeBackend, FakeReader
from .test_vfrate_backend import CFG as VF_CFG
from .test_vfrate_backend import FakeNic, Reader as VfReader

SILENT = "no answer from the kernel within 5 s"
HTB_ROOT = 0x7368 << 16


def timeout(what: str, device: str) -> KernelError:
    return KernelError("read", what, device, SILENT, errno.ETIMEDOUT)


class TcReader(FakeReader):
    """A node's links and tc state as rows; ``fail``: (what, ifindex, parent or None) -> the error raised."""

    def __init__(self, links, qdiscs, filters=None, fail=None):
        self._links, self._qdiscs = links, qdiscs
        self._filters = filters or {}  # (ifindex, parent) -> rows
        self.fail = fail or {}

    def links(self):
        return list(self._links)

    def qdiscs(self, ifindex=0, device="node"):
        return [q for q in self._qdiscs if not ifindex or q.ifindex == ifindex]

    def htb_classes(self, ifindex, device):
        if ("classes", ifindex, None) in self.fail:
            raise self.fail[("classes", ifindex, None)]
        return []

    def filters(self, ifindex, parent, device):
        for key in (("filters", ifindex, parent), ("filters", ifindex, None)):
            if key in self.fail:
                raise self.fail[key]
        return list(self._filters.get((ifindex, parent), ()))


def recording(backend):
    """The backend's kernel writes replaced by a record: every operation lands."""
    backend.sent = []

    def apply(td, batch=True):
        backend.sent.extend(td.ops)
        return ApplyResult(applied=list(td.ops))
    backend.apply = apply
    return backend


def failed(rep):
    return {(d.backend, d.device): d.error for d in rep.devices if d.error}


def links(*names):
    return [LinkRow(1, "lo", "", 65536, True)] + [LinkRow(i, n, "veth", 1500, True) for i, n in names]


# -- the engine's part -----------------------------------------------------------------------------

def test_empty_targets_are_dropped_and_an_unreadable_one_fails_the_teardown_in_words(tmp_path):
    class Unreadable(FakeBackend):
        def teardown(self, observed):
            return [TargetDiff("dev-a"), TargetDiff("dev-b", error="read things on dev-b: timed out")]

    quiet, sick = FakeBackend("quiet", {}), Unreadable("sick", {})
    rep = Reconciler(FakeReader(), [quiet, sick], Capabilities(), roots=Roots.of(proc=str(tmp_path))).teardown()
    assert [(d.backend, d.device) for d in rep.devices] == [("sick", "dev-b")]  # nothing to say about the rest
    assert not rep.ok and rep.changes == 0
    assert rep.devices[0].error == ("teardown sick on dev-b: could not read it (read things on dev-b: timed out): "
                                    "what it owns there may remain")


def test_a_backend_that_cannot_read_the_node_fails_the_teardown_and_the_others_go_on(tmp_path):
    broken = FakeBackend("broken", {}, fail_observe=KernelError("dump", "qdiscs", "node", "Operation not permitted", 1))
    good = FakeBackend("good", {})
    rep = Reconciler(FakeReader(), [broken, good], Capabilities(), roots=Roots.of(proc=str(tmp_path))).teardown()
    assert not rep.ok
    by = {b.name: b for b in rep.backends}
    assert by["broken"].error == ("teardown broken: dump qdiscs on node: Operation not permitted: "
                                  "what it owns there may remain on any device")
    assert by["good"].error is None


# -- htb: the class dump never answers ----------------------------------------------------------------

def test_htb_a_silent_class_dump_fails_that_device_and_the_other_is_torn_down(tmp_path):
    reader = TcReader(links((2, "up0"), (3, "up2")),
                      [QdiscRow(2, HTB_ROOT, TC_H_ROOT, "htb"), QdiscRow(3, HTB_ROOT, TC_H_ROOT, "htb")],
                      fail={("classes", 2, None): timeout("classes", "up0")})
    htb = recording(HtbBackend(writer=None))
    rep = Reconciler(reader, [htb], Capabilities(), roots=Roots.of(proc=str(tmp_path))).teardown()
    assert not rep.ok
    assert failed(rep) == {("htb", "up0"): (
        f"teardown htb on up0: could not read it (read classes on up0: {SILENT}): its root qdisc 7368: with its "
        "classes, leaves and filters, and its map classifier may remain")}
    assert [(type(op), op.device) for op in htb.sent] == [(DeleteRoot, "up2")]  # up0's tree was never guessed at


# -- edt: a partial state whose stamper cannot be read ------------------------------------------------

def test_edt_unreadable_filters_fail_the_device_and_its_root_still_goes(tmp_path):
    reader = TcReader(links((2, "up0")),
                      [QdiscRow(2, EDT_ROOT, TC_H_ROOT, "mq"),
                       QdiscRow(2, clsact.CLSACT_HANDLE, clsact.TC_H_CLSACT, "clsact")],
                      fail={("filters", 2, clsact.EGRESS): timeout("filters", "up0")})
    edt = recording(EdtBackend(writer=None))
    rec = Reconciler(reader, [edt], Capabilities(), roots=Roots.of(proc=str(tmp_path)))
    dry = rec.teardown(dry_run=True)
    (t,) = [d for d in dry.devices if d.backend == "edt"]
    assert [type(op) for op in t.ops] == [EdtDeleteRoot] and not edt.sent  # planned, nothing sent
    rep = rec.teardown()
    assert not rep.ok
    assert failed(rep)[("edt", "up0")] == (
        f"teardown edt on up0: could not read it (read filters on up0: {SILENT}): its stamper and the map "
        "classifier on clsact egress may remain")
    assert [type(op) for op in edt.sent] == [EdtDeleteRoot]
    # the clsact's filters could not be read either: whether shaperd added it is unknown, so it stays and is said
    assert failed(rep)[("clsact", "up0")].startswith("teardown clsact on up0: could not read it (read filters")


# -- marks: a pod interface whose ingress filters cannot be read ---------------------------------------

def test_marks_an_unreadable_pod_interface_fails_and_a_vanished_one_is_nothing(tmp_path):
    qd = [QdiscRow(i, clsact.CLSACT_HANDLE, clsact.TC_H_CLSACT, "clsact") for i in (7, 8, 9)]
    mark = FilterRow(9, clsact.INGRESS, PRIO_MARK_INGRESS, 3, 1, "bpf", name="shpdm_0123456789")
    reader = TcReader(links((7, "veth7"), (8, "veth8"), (9, "veth9")), qd, {(9, clsact.INGRESS): [mark]},
                      fail={("filters", 7, clsact.INGRESS): timeout("filters", "veth7"),
                            ("filters", 8, clsact.INGRESS): KernelError("dump", "filters", "veth8", "No such device",
                                                                        errno.ENODEV)})
    marks = recording(MarksBackend(writer=None))
    rep = Reconciler(reader, [marks], Capabilities(), roots=Roots.of(proc=str(tmp_path))).teardown()
    assert not rep.ok
    assert {k: v for k, v in failed(rep).items() if k[0] == "marks"} == {("marks", "veth7"): (
        f"teardown marks on veth7: could not read it (read filters on veth7: {SILENT}): its mark program on "
        "clsact ingress may remain")}
    # veth9's program went, and then its clsact, which held nothing else
    assert [(type(op).__name__, op.device) for op in marks.sent] == [("DeleteMark", "veth9"), ("DeleteClsact", "veth9")]


# -- vfrate: the PF no longer reads -------------------------------------------------------------------

def test_vfrate_an_unreadable_pf_fails_the_teardown(tmp_path):
    node = Node(tmp_path).build()
    roots = Roots.of(sys=str(node.sys), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))
    nic = FakeNic()
    vf = VfRateBackend(writer=None, kernel=nic, state_file=tmp_path / "run" / "shaperd" / "vfrate-owned.json")
    rec = Reconciler(VfReader(), [vf], Capabilities(), roots=roots)
    assert rec.apply(config.load_text(VF_CFG)).ok and vf.ours  # shaperd set two VFs

    def silent(reads, ifindex, device):
        raise timeout("VF rates", device)
    nic.read = silent
    again = VfRateBackend(writer=None, kernel=nic, state_file=vf.state_file)  # a fresh `shaperd teardown`
    rep = Reconciler(VfReader(), [again], Capabilities(), roots=roots).teardown()
    assert not rep.ok and rep.changes == 0
    assert failed(rep) == {("vfrate", "ens1f0"): (
        f"teardown vfrate on ens1f0: could not read it (read VF rates on ens1f0: {SILENT}): the VF rates "
        "shaperd set may remain")}


# -- devlink: the rate dump fails; a kernel without devlink has nothing to tear down -------------------

def test_devlink_an_unreadable_rate_dump_fails_and_a_kernel_without_devlink_is_fine(tmp_path):
    fake = FakeDevlink()

    def silent():
        raise KernelError("dump", "devlink rate objects", "devlink", SILENT, errno.ETIMEDOUT)
    fake.rates = silent
    rep = Reconciler(FakeReader(), [DevlinkBackend(lambda: fake)], Capabilities(),
                     roots=Roots.of(proc=str(tmp_path))).teardown()
    assert not rep.ok
    assert failed(rep) == {("devlink", "devlink"): (
        f"teardown devlink on devlink: could not read it (dump devlink rate objects on devlink: {SILENT}): its "
        "rate nodes (shpd_*) and the leaves parented to them may remain")}

    class Absent(FakeDevlink):
        def family(self):
            raise nl.DevlinkAbsent("resolve", "generic netlink family devlink", "node", "no such family",
                                   errno.ENOENT)

        def rates(self):
            raise AssertionError("no rate dump where the kernel has no devlink")
    none = Absent()
    rep = Reconciler(FakeReader(), [DevlinkBackend(lambda: none)], Capabilities(),
                     roots=Roots.of(proc=str(tmp_path))).teardown()
    assert rep.ok and not rep.devices


# -- dcb: a RoCE uplink that does not answer; one without DCB holds nothing ----------------------------

def test_dcb_an_unreadable_uplink_fails_and_one_without_dcb_is_nothing(tmp_path):
    roots = Roots.of(sys=str(Node(tmp_path).build().sys), proc=str(tmp_path))
    fake = FakeDcb(["ens1f0"])
    b = DcbBackend(client=fake)
    rec = Reconciler(FakeReader(), [b], Capabilities(), roots=roots)
    assert rec.apply(config.load_text("node: {capacity: 100Gbps}\n" + cfg_text(TWO))).ok

    def silent(nd):
        raise timeout("DCB IEEE configuration", nd)
    fake.get = silent
    rep = Reconciler(FakeReader(), [DcbBackend(client=fake)], Capabilities(), roots=roots).teardown()
    assert not rep.ok
    assert failed(rep) == {("dcb", "ens1f0"): (
        f"teardown dcb on ens1f0: could not read it (read DCB IEEE configuration on ens1f0: {SILENT}): the "
        "per-TC max rates shaperd set may remain")}
    rep = Reconciler(FakeReader(), [DcbBackend(client=FakeDcb([]))], Capabilities(), roots=roots).teardown()
    assert rep.ok and not rep.devices  # FakeDcb([]) answers DcbNotSupported: no DCB, nothing of shaperd's


# -- nccl env files: the directory cannot be listed ---------------------------------------------------

def test_nccl_an_unreadable_directory_fails_the_teardown(tmp_path):
    roots = Roots.of(sys=str(tmp_path / "sys"), proc=str(tmp_path / "proc"), run=str(tmp_path / "run"))
    where = tmp_path / "run" / "shaperd" / "nccl"
    where.parent.mkdir(parents=True)
    where.write_text("not a directory\n")  # listing it fails (ENOTDIR), as an unreadable one would
    rep = Reconciler(FakeReader(), [RdmaBackend(roots)], Capabilities(), roots=roots).teardown()
    assert not rep.ok
    (err,) = failed(rep).values()
    assert err.startswith(f"teardown rdma on {where}: could not read it (read directory {where}: ")
    assert err.endswith("shaperd's NCCL env files may remain")
    where.unlink()
    assert Reconciler(FakeReader(), [RdmaBackend(roots)], Capabilities(), roots=roots).teardown().ok


# -- the clsact qdisc ----------------------------------------------------------------------------------

def _row(parent, prio, name, kind="bpf", handle=1):
    return FilterRow(2, parent, prio, 3, handle, kind, name=name)


CLASSIFIER = _row(clsact.EGRESS, mapcls.PRIO_EGRESS_CLASSIFY, "shpd_c012345678", handle=mapcls.HANDLE_EGRESS_CLASSIFY)
STAMPER = _row(clsact.EGRESS, PRIO_STAMPER, "shpe_0123456789")
MARK = _row(clsact.INGRESS, PRIO_MARK_INGRESS, "shpdm_0123456789")
CILIUM = _row(clsact.INGRESS, 1, "cil_from_netdev")


def test_each_backend_claims_only_its_own_clsact_filters():
    htb, edt, marks = HtbBackend(None), EdtBackend(None), MarksBackend(None)
    assert [htb.owns_clsact_filter(r) for r in (CLASSIFIER, STAMPER, MARK, CILIUM)] == [True, False, False, False]
    assert [edt.owns_clsact_filter(r) for r in (CLASSIFIER, STAMPER, MARK, CILIUM)] == [True, True, False, False]
    assert [marks.owns_clsact_filter(r) for r in (CLASSIFIER, STAMPER, MARK, CILIUM)] == [False, False, True, False]
    # shaperd's prio and handle with someone else's program is not shaperd's
    assert not htb.owns_clsact_filter(CLASSIFIER._replace(name="other_program"))
    assert not marks.owns_clsact_filter(MARK._replace(parent=clsact.EGRESS))


def test_the_clsact_rule_only_shaperds_filters_is_removed_mixed_is_said_none_is_not_looked_at():
    c = clsact.teardown([clsact.Clsact("a", 2, owners=["htb", "edt"]),
                         clsact.Clsact("b", 3, owners=["marks"], foreign=["ingress bpf prio 1 cil_from_netdev"]),
                         clsact.Clsact("c", 4, foreign=["egress u32 prio 5"]),
                         clsact.Clsact("d", 5),
                         clsact.Clsact("e", 6, error="read filters on e: timed out")])
    assert [(owner, td.target, [type(op) for op in td.ops], td.note is not None, td.error) for owner, td in c] == [
        ("htb", "a", [clsact.DeleteClsact], False, None),
        (None, "b", [], True, None),
        (None, "e", [], False, "read filters on e: timed out")]
    assert c[1][1].note == ("clsact qdisc on b left in place: it holds filters that are not shaperd's "
                            "(ingress bpf prio 1 cil_from_netdev)")


def test_a_clsact_is_judged_before_the_backends_remove_their_filters_and_removed_through_its_owner(tmp_path):
    qd = [QdiscRow(2, HTB_ROOT, TC_H_ROOT, "htb"), QdiscRow(2, clsact.CLSACT_HANDLE, clsact.TC_H_CLSACT, "clsact"),
          QdiscRow(3, clsact.CLSACT_HANDLE, clsact.TC_H_CLSACT, "clsact")]
    reader = TcReader(links((2, "up0"), (3, "veth3")), qd,
                      {(2, clsact.EGRESS): [CLASSIFIER._replace(ifindex=2)],
                       (3, clsact.INGRESS): [MARK._replace(ifindex=3), CILIUM._replace(ifindex=3)]})
    htb, marks = recording(HtbBackend(None)), recording(MarksBackend(None))
    rep = Reconciler(reader, [htb, marks], Capabilities(), roots=Roots.of(proc=str(tmp_path))).teardown()
    assert rep.ok, failed(rep)
    assert [(type(op).__name__, op.device) for op in htb.sent] == [
        ("DeleteRoot", "up0"), ("DetachMapClassifier", "up0"), ("DeleteClsact", "up0")]
    assert [(type(op).__name__, op.device) for op in marks.sent] == [("DeleteMark", "veth3")]  # Cilium's clsact stays
    (note,) = [d for d in rep.devices if d.note]
    assert (note.backend, note.device) == ("clsact", "veth3") and "cil_from_netdev" in note.note


def test_delete_clsact_is_byte_for_byte_what_tc_sends():
    """tests/unit/fixtures/clsact/del_clsact.strace: ``strace -f -e trace=sendmsg,recvmsg -e write=all -e read=all
    -xx tc -n NS qdisc del dev c0 clsact`` on this machine's kernel (6.18), the request and its ack kept."""
    text = (Path(__file__).parent / "fixtures" / "clsact" / "del_clsact.strace").read_text()
    (theirs,) = sent(text)
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    ours = tc._encoder(tc.build_message(clsact.DeleteClsact(device="c0", ifindex=ifindex), codec=CLSACT_CODEC))(7)
    assert nlmsg.HDR.unpack_from(ours)[:3] == nlmsg.HDR.unpack_from(theirs)[:3]  # length, RTM_DELQDISC, flags
    assert ours[16:] == theirs[16:]  # seq and pid aside, equal


def test_kept_is_the_one_filter():
    assert teardown_mod.kept([TargetDiff("a"), TargetDiff("b", blocked="x"), TargetDiff("c", note="y"),
                              TargetDiff("d", error="z")]) == [TargetDiff("b", blocked="x"),
                                                               TargetDiff("c", note="y"), TargetDiff("d", error="z")]


def test_unlistable_bpffs_pins_fail_the_teardown_of_htb_and_edt():
    from shaperd.backends.edt.backend import EdtObserved
    from shaperd.backends.htb.backend import HtbObserved

    why = "list bpf pins in /sys/fs/bpf/shaperd/node/htb: Permission denied"
    (td,) = teardown_mod.kept(HtbBackend(None).teardown(HtbObserved(pin_error=why)))
    assert (td.target, td.error) == ("htb bpffs pins", why)
    tds = teardown_mod.kept(EdtBackend(None).teardown(EdtObserved(pin_errors={"edt stamper bpffs pins": why})))
    assert [(td.target, td.error) for td in tds] == [("edt stamper bpffs pins", why)]
