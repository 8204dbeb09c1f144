"""The generic reconciler, driven by fake backends: no root, no kernel.

One backend failing (kernel error, or a bug) is reported and the others are
applied; an in-sync reconcile issues no operation; a failed batch is
re-observed, re-diffed and replayed one by one; probes run once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from shaperd.core import config
from shaperd.core.protocol import ApplyResult, BackendStats, ClassTarget, Operation, Support, TargetDiff
from shaperd.engine.reconciler import Reconciler
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities
from shaperd.kernel.rtnl_rows import LinkRow
from shaperd.core.roots import Roots

CFG = config.load_text("tenants:\n  - {name: a, bandwidthGuarantee: 1Gbps}\n")


@dataclass(frozen=True, kw_only=True)
class SetThing(Operation):
    key: str
    value: int
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"thing {self.key}"


class FakeReader:
    """Enough of RtnlReader for discovery: one uplink, no routes."""

    def links(self):
        return [LinkRow(1, "lo", "", 65536, True), LinkRow(2, "eth0", "", 1500, True)]

    def routes(self, family):
        return []


@dataclass
class Desired:
    things: dict[str, int]
    problems: tuple = ()
    warnings: tuple[str, ...] = ()


@dataclass
class FakeBackend:
    """Desired state is a dict; the 'kernel' is another dict; apply writes into it."""

    name: str
    want: dict[str, int]
    kernel: dict[str, int] = field(default_factory=dict)
    fail_observe: Exception | None = None
    fail_batch_once: bool = False
    enabled: bool = True
    probes: int = 0
    writes: list[list[str]] = field(default_factory=list)

    def probe(self, caps):
        self.probes += 1
        return Support(self.enabled, () if self.enabled else (f"{self.name} unsupported here",))

    def plan(self, ctx):
        return Desired(dict(self.want))

    def observe(self, reads, inv):
        if self.fail_observe is not None:
            raise self.fail_observe
        return dict(self.kernel)

    def diff(self, desired, observed):
        ops = [SetThing(device=f"dev-{self.name}", ifindex=0, key=k, value=v)
               for k, v in sorted(desired.things.items()) if observed.get(k) != v]
        return [TargetDiff(f"dev-{self.name}", ops)]

    def apply(self, diff, batch=True):
        self.writes.append([op.key for op in diff.ops])
        if batch and self.fail_batch_once:
            self.fail_batch_once = False
            self.kernel[diff.ops[0].key] = diff.ops[0].value  # part of the batch landed
            return ApplyResult(batch_failed=True)
        res = ApplyResult()
        for op in diff.ops:
            if op.key == "bad":
                res.failed.append((op, op.error("Operation not permitted", 1)))
            else:
                self.kernel[op.key] = op.value
                res.applied.append(op)
        return res

    def stats(self, desired):
        return BackendStats(targets={(f"dev-{self.name}", 1): ClassTarget("a", f"dev-{self.name}", 1, 1, 2)},
                            devices=(f"dev-{self.name}",))

    def teardown(self, observed):
        return [TargetDiff(f"dev-{self.name}", [])]


def reconciler(*backends, tmp_path):
    return Reconciler(FakeReader(), list(backends), Capabilities(), roots=Roots.of(proc=str(tmp_path)))


def test_one_backend_fails_the_others_are_applied(tmp_path):
    broken = FakeBackend("broken", {"x": 1}, fail_observe=KernelError("dump", "qdiscs", "node", "Operation not permitted", 1))
    buggy = FakeBackend("buggy", {"y": 1}, fail_observe=ZeroDivisionError("a bug"))
    good = FakeBackend("good", {"a": 1, "b": 2})
    rep = reconciler(broken, buggy, good, tmp_path=tmp_path).apply(CFG)
    assert good.kernel == {"a": 1, "b": 2}
    by_name = {b.name: b for b in rep.backends}
    assert by_name["broken"].error == "dump qdiscs on node: Operation not permitted"
    assert "internal error" in by_name["buggy"].error and "a bug" in by_name["buggy"].error
    assert by_name["good"].error is None and [op.key for op in by_name["good"].targets[0].ops] == ["a", "b"]
    assert not rep.ok and rep.changes == 2
    # The failed backends show as errored targets, so the daemon retries and metrics count them.
    assert {(d.backend, d.error is not None) for d in rep.devices} >= {("broken", True), ("buggy", True)}


def test_in_sync_reconcile_issues_no_operation(tmp_path):
    b1, b2 = FakeBackend("one", {"a": 1}), FakeBackend("two", {"b": 2})
    rec = reconciler(b1, b2, tmp_path=tmp_path)
    first = rec.apply(CFG)
    assert first.changes == 2 and first.ok
    b1.writes.clear(), b2.writes.clear()
    again = rec.apply(CFG)
    assert again.changes == 0 and again.ok
    assert b1.writes == [] and b2.writes == []  # apply was not even called: nothing to send


def test_failed_batch_is_reread_rediffed_and_replayed_one_by_one(tmp_path):
    b = FakeBackend("b", {"a": 1, "bad": 2, "c": 3}, fail_batch_once=True)
    rep = reconciler(b, tmp_path=tmp_path).apply(CFG)
    # The batch landed "a" before failing; the replay only sends what is still missing.
    assert b.writes == [["a", "bad", "c"], ["bad", "c"]]
    (t,) = rep.devices
    assert [op.key for op in t.ops] == ["c"]
    assert [(op.key, str(e)) for op, e in t.failed] == [("bad", "set thing bad on dev-b: Operation not permitted")]
    assert b.kernel == {"a": 1, "c": 3}


def test_diff_writes_nothing_and_reports_what_apply_would_do(tmp_path):
    b = FakeBackend("b", {"a": 1})
    rep = reconciler(b, tmp_path=tmp_path).diff(CFG)
    assert b.writes == [] and b.kernel == {}
    assert [op.describe() for d in rep.devices for op in d.ops] == ["set thing a on dev-b"]


def test_probe_runs_once_and_a_disabled_backend_is_left_out(tmp_path):
    on, off = FakeBackend("on", {"a": 1}), FakeBackend("off", {"z": 1}, enabled=False)
    rec = reconciler(on, off, tmp_path=tmp_path)
    rec.apply(CFG), rec.apply(CFG)
    assert on.probes == off.probes == 1
    assert off.writes == [] and [b.name for b in rec.apply(CFG).backends] == ["on"]
    assert rec.support["off"].notes == ("off unsupported here",)


def test_stats_are_merged_over_backends(tmp_path):
    rep = reconciler(FakeBackend("one", {}), FakeBackend("two", {}), tmp_path=tmp_path).apply(CFG)
    assert set(rep.targets) == {("dev-one", 1), ("dev-two", 1)}
    assert rep.planned_devices == ("dev-one", "dev-two")


@dataclass
class VanishingBackend(FakeBackend):
    """Writes to ifindex 7 (a pod's veth deleted between discovery and the write) fail with ENODEV; to 2
    (eth0, still there) too, when ``nodev_on_present``."""

    nodev_on_present: bool = False

    def diff(self, desired, observed):
        return [TargetDiff("pods", [SetThing(device="cc7", ifindex=7, key="gone", value=1),
                                    SetThing(device="eth0", ifindex=2, key="here", value=1)])]

    def apply(self, diff, batch=True):
        res = ApplyResult()
        for op in diff.ops:
            if op.ifindex == 7 or self.nodev_on_present:
                res.failed.append((op, op.error("No such device", 19)))
            else:
                res.applied.append(op)
        return res


def test_a_write_to_a_device_that_went_away_is_not_a_failure_one_to_a_present_device_is(tmp_path):
    """A pod's veth deleted mid-reconcile (seen in the 1,000-pod churn): ENODEV where the link is gone is
    noted, not failed, so health and the retry loop do not count it; ENODEV on a link that is still there
    stays a failure."""
    b = VanishingBackend("v", {})
    rep = reconciler(b, tmp_path=tmp_path).apply(CFG)
    (t,) = rep.devices
    assert t.failed == [] and [op.key for op in t.ops] == ["here"]
    assert t.note == "1 write(s) not made: cc7 went away during the reconcile"
    assert rep.ok
    b = VanishingBackend("v", {}, nodev_on_present=True)
    (t,) = reconciler(b, tmp_path=tmp_path).apply(CFG).devices
    assert [op.key for op, _e in t.failed] == ["here"] and "cc7" in (t.note or "")
