"""Verify at apply, fall back: a kernel that does not know sch_fq refuses edt on a device, and the next plan
puts that device on htb. The backend's part with a fake kernel writer; the engine's part with fake backends."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from shaperd.core import config
from shaperd.core.protocol import ApplyResult, BackendStats, TargetDiff
from shaperd.backends.edt import backend as edt_backend
from shaperd.backends.edt.backend import EdtBackend
from shaperd.backends.edt.objects import FqQdisc, Stamper
from shaperd.backends.edt.ops import DeleteRoot, SetFq, SetRoot, SetStamper
from shaperd.backends.edt.refusals import Refusals, refusal_of
from shaperd.core.dataplane import select
from shaperd.backends.common.clsact import AddClsact
from shaperd.engine.reconciler import Reconciler
from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.kernel.rtnl_rows import LinkRow
from shaperd.core.roots import Roots

UNKNOWN = "No such file or directory (Specified qdisc kind is unknown)"  # tc._cause of the kernel's answer
KW = dict(device="up0", ifindex=7)


def _fq(q: int) -> FqQdisc:
    return FqQdisc(0x73650000 | q, (0x8000 + q) << 16, 10000, 100, 125000)


DIFF = TargetDiff("up0", [SetRoot(kind="mq", handle=0x73650000, **KW), SetFq(fq=_fq(1), **KW), SetFq(fq=_fq(2), **KW),
                          AddClsact(**KW), SetStamper(stamper=Stamper("shpe_x", 100_000_000), **KW)])


class FakeKernel:
    """tc.apply_ops stand-in: fq is unknown (ENOENT with the kernel's extack), everything else lands."""

    def __init__(self, fq_answer=(errno.ENOENT, UNKNOWN)):
        self.sent: list = []
        self.fq_answer = fq_answer

    def apply_ops(self, writer, ops, batch=True, pins=None, codec=None):
        res = ApplyResult()
        for op in ops:
            self.sent.append(op)
            if isinstance(op, SetFq) and self.fq_answer is not None:
                res.failed.append((op, op.error(self.fq_answer[1], self.fq_answer[0])))
            else:
                res.applied.append(op)
        return res


def test_unknown_kind_refuses_edt_on_the_device_and_undoes_its_root(monkeypatch):
    k = FakeKernel()
    monkeypatch.setattr(edt_backend.tc, "apply_ops", k.apply_ops)
    be = EdtBackend(writer=None)
    res = be.apply(DIFF, batch=False)
    # The root landed, both fq were refused; nothing after them was sent; the root was removed again.
    assert [type(op) for op in k.sent] == [SetRoot, SetFq, SetFq, DeleteRoot]
    assert [type(op) for op in res.applied] == [SetRoot, DeleteRoot] and res.failed == []
    ((dev, (idx, why)),) = be.refused(None).items()
    assert (dev, idx) == ("up0", 7)
    assert why.startswith("the kernel does not know qdisc kind fq (sch_fq): set fq qdisc 8001: (parent 7365:1) on up0")
    assert "Specified qdisc kind is unknown" in why


def test_a_refused_root_is_not_deleted(monkeypatch):
    # A single-queue device: the root itself is sch_fq, refused, so the device's root never changed.
    k = FakeKernel()
    monkeypatch.setattr(edt_backend.tc, "apply_ops", lambda w, ops, batch=True, pins=None, codec=None: _fail_all(k, ops))
    be = EdtBackend(writer=None)
    diff = TargetDiff("up0", [SetRoot(kind="fq", handle=0x73650000, fq=_fq(0), **KW), AddClsact(**KW)])
    res = be.apply(diff, batch=False)
    assert [type(op) for op in k.sent] == [SetRoot] and res.applied == [] and res.failed == []
    assert "qdisc kind fq" in be.refused(None)["up0"][1]


def _fail_all(k, ops):
    k.sent.extend(ops)
    return ApplyResult(failed=[(op, op.error(UNKNOWN, errno.ENOENT)) for op in ops])


def test_other_failures_are_failures_not_refusals(monkeypatch):
    k = FakeKernel(fq_answer=(errno.EINVAL, "Invalid argument"))
    monkeypatch.setattr(edt_backend.tc, "apply_ops", k.apply_ops)
    be = EdtBackend(writer=None)
    res = be.apply(DIFF, batch=False)
    assert len(res.failed) == 2 and be.refused(None) == {}
    assert SetStamper in [type(op) for op in k.sent]  # the rest of the device went on as before


def test_refusal_of_reads_errno_and_extack():
    op = SetFq(fq=_fq(1), **KW)
    assert refusal_of(op, op.error(UNKNOWN, errno.ENOENT))
    assert refusal_of(op, op.error("No such file or directory", errno.ENOENT))  # no extack (old kernels)
    assert refusal_of(op, op.error("No such file or directory (Failed to find specified qdisc)", errno.ENOENT)) is None
    assert refusal_of(op, op.error("Invalid argument", errno.EINVAL)) is None
    add = AddClsact(**KW)
    assert refusal_of(add, add.error(UNKNOWN, errno.ENOENT)) is None  # only edt's qdiscs


def test_refusals_are_forgotten_when_the_device_goes_or_comes_back_new():
    r = Refusals()
    assert r.add("up0", 7, "why") and not r.add("up0", 7, "why")  # warned once
    r.add("up1", 8, "why")
    inv = Inventory(links=(Link("up0", 7), Link("up1", 9)))  # up1 recreated: a new ifindex
    assert r.current(inv) == {"up0": (7, "why")}
    assert r.current(Inventory(links=())) == {}


CAPS = Capabilities(bpf=True, bpf_maps=True, bpf_adopt="pins", fq=True, mq=True)
EDT = config.load_text("""node:
  dataplane: edt
  interfaces: [eth0]
  capacity: 10Gbps
tenants:
  - {name: a, bandwidthGuarantee: 1Gbps, match: {cidrs: [198.18.1.0/24]}}
""")


def test_select_puts_a_refused_device_on_htb_only_while_it_is_that_device():
    link = Link("eth0", 2, tx_queues=4)
    planes, warnings = select(EDT, [link], CAPS, {"eth0": (2, "the kernel does not know qdisc kind fq")})
    assert planes == {"eth0": "htb"}
    assert warnings == ["node.dataplane edt on eth0: edt refused: the kernel does not know qdisc kind fq; "
                        "enforcing with htb"]
    assert select(EDT, [link], CAPS, {"eth0": (99, "old device")})[0] == {"eth0": "edt"}


# -- the engine: the refusal reaches the next plan as data, at once, and only once ---------------------------

class Reader:
    def __init__(self, links):
        self.rows = links

    def links(self):
        return self.rows

    def routes(self, family):
        return []


@dataclass
class Want:
    things: set
    problems: tuple = ()
    warnings: tuple = ()


@dataclass
class Plane:
    """A fake backend planning 'plane:device' for the uplinks tenancy gives it; the edt one can be refused."""

    name: str
    refuse: bool = False
    kernel: set = field(default_factory=set)
    writes: int = 0
    refusals: Refusals = field(default_factory=Refusals)
    seen_refused: list = field(default_factory=list)

    def probe(self, caps):
        from shaperd.core.protocol import Support
        return Support(True)

    def plan(self, ctx):
        self.seen_refused.append(dict(ctx.refused))
        return Want({f"{self.name}:{d}" for d, p in ctx.tenancy.dataplanes.items() if p == self.name})

    def observe(self, reads, inv):
        return set(self.kernel)

    def diff(self, desired, observed):
        return [TargetDiff(x, [SetRoot(kind=self.name, handle=1, device=x.split(":")[1], ifindex=2)])
                for x in sorted(desired.things - observed)] + \
            [TargetDiff(x, [DeleteRoot(handle=1, device=x.split(":")[1], ifindex=2)])
             for x in sorted(observed - desired.things)]

    def apply(self, diff, batch=True):
        self.writes += 1
        op = diff.ops[0]
        if self.refuse and isinstance(op, SetRoot):
            self.refusals.add(op.device, op.ifindex, "the kernel does not know qdisc kind fq")
            return ApplyResult()
        (self.kernel.add if isinstance(op, SetRoot) else self.kernel.discard)(diff.target)
        return ApplyResult(applied=[op])

    def refused(self, inv):
        return self.refusals.current(inv) if self.name == "edt" else {}

    def stats(self, desired):
        return BackendStats()

    def teardown(self, observed):
        return []


def test_engine_replans_at_once_after_a_refusal_then_stays_put(tmp_path):
    htb, edt = Plane("htb"), Plane("edt", refuse=True)
    reader = Reader([LinkRow(1, "lo", "", 65536, True), LinkRow(2, "eth0", "", 1500, True)])
    rec = Reconciler(reader, [htb, edt], CAPS, roots=Roots.of(proc=str(tmp_path), sys=str(tmp_path)))
    rep = rec.apply(EDT)
    assert htb.kernel == {"htb:eth0"} and edt.kernel == set()  # on htb within the same apply
    assert rep.ok and any("edt refused" in w for w in rep.plan.warnings)
    assert htb.seen_refused[-1] == {"edt": {"eth0": (2, "the kernel does not know qdisc kind fq")}}
    writes = (htb.writes, edt.writes)
    again = rec.apply(EDT)  # no retry, no flapping: nothing to write
    assert again.changes == 0 and (htb.writes, edt.writes) == writes
    reader.rows = [LinkRow(1, "lo", "", 65536, True), LinkRow(3, "eth0", "", 1500, True)]  # a new eth0
    rec.apply(EDT)
    assert edt.writes == writes[1] + 1  # re-verified on the new device


def test_the_refusal_is_a_metric_per_device():
    from prometheus_client import CollectorRegistry, generate_latest

    from shaperd.backends.edt.metrics import EdtCollector

    be = EdtBackend(writer=None)
    reg = CollectorRegistry()
    reg.register(EdtCollector(lambda: None, [be]))
    assert b'shaperd_edt_refused{' not in generate_latest(reg)
    be.refusals.add("up0", 7, "the kernel does not know qdisc kind fq")
    assert 'shaperd_edt_refused{device="up0"} 1.0' in generate_latest(reg).decode()


def test_the_refusals_file_for_status_follows_the_memory(tmp_path):
    from argparse import Namespace

    from shaperd.engine import refusals_file as edt_refused

    path = edt_refused.path_for(tmp_path, None)
    assert path == tmp_path / "shaperd" / "refused-host.json"
    assert edt_refused.path_for(tmp_path, "n1").name == "refused-netns-n1.json"
    args = Namespace(run_root=str(tmp_path), netns=None)
    assert edt_refused.doc(args) == {} and edt_refused.render(args) == ""  # no file: nothing to say
    edt_refused.record(path, {"edt": {"eth0": (2, "the kernel does not know qdisc kind fq")}})
    assert edt_refused.doc(args) == {"edt_refused": {"eth0": "the kernel does not know qdisc kind fq"}}
    assert edt_refused.render(args).splitlines()[1] == "  eth0: the kernel does not know qdisc kind fq"
    edt_refused.record(path, {})
    assert not path.exists()


def test_the_reconciler_records_refusals_where_open_node_points_it(tmp_path):
    htb, edt = Plane("htb"), Plane("edt", refuse=True)
    reader = Reader([LinkRow(1, "lo", "", 65536, True), LinkRow(2, "eth0", "", 1500, True)])
    rec = Reconciler(reader, [htb, edt], CAPS, roots=Roots.of(proc=str(tmp_path), sys=str(tmp_path)))
    rec.refused_file = tmp_path / "run" / "shaperd" / "refused-host.json"
    rec.apply(EDT)
    import json

    assert json.loads(rec.refused_file.read_text())["refused"] == {
        "edt": {"eth0": {"ifindex": 2, "reason": "the kernel does not know qdisc kind fq"}}}
    reader.rows = [LinkRow(1, "lo", "", 65536, True)]  # the device went away: forgotten, and so is the file
    rec.apply(EDT)
    assert not rec.refused_file.exists()
