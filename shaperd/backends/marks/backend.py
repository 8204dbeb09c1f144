"""The marks backend: the protocol's six steps for the mark programs on pod interfaces."""

from __future__ import annotations

import errno

from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.kernel import tc
from shaperd.backends.marks import kernel_tc
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.backends.marks import plan as marks_plan
from shaperd.backends.marks.objects import PRIO_MARK_INGRESS, PROGRAM_PREFIX, TC_H_INGRESS_PARENT, MarksObserved, MarksPlan, ObservedMark


class MarksBackend:
    name = "marks"
    # What may be left on an interface a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its mark program on clsact ingress"

    def __init__(self, writer):
        self.writer = writer

    def probe(self, caps: Capabilities) -> Support:
        if not caps.bpf:
            return Support(False, ("cls_bpf unavailable: pods are recognised by address only "
                                   "(not after masquerade or encapsulation)",))
        return Support(True)

    def wanted(self, ctx: PlanInput) -> bool:
        """Mark programs are for tenants' pods: without one on this node, cls_bpf is not missed."""
        return bool(ctx.tenancy.pod_tenants)

    def plan(self, ctx: PlanInput) -> MarksPlan:
        return marks_plan.plan(ctx.config, ctx.inventory, ctx.tenancy)

    def observe(self, reads, inv: Inventory) -> MarksObserved:
        qdiscs = reads.all_qdiscs()
        clsact = frozenset(q.ifindex for q in qdiscs if q.kind == "clsact")
        ingress_qdisc = frozenset(q.ifindex for q in qdiscs if q.kind == "ingress")
        names = {l.ifindex: l.name for l in inv.links}
        found: dict[int, ObservedMark] = {}
        errors: dict[int, str] = {}
        for idx in sorted(clsact):
            try:
                filters = reads.filters(idx, TC_H_INGRESS_PARENT, names.get(idx, str(idx)))
            except KernelError as e:
                if e.errno != errno.ENODEV:  # ENODEV: the interface went away between the two dumps
                    errors[idx] = str(e)
                continue
            for f in filters:
                if self.owns_clsact_filter(f):
                    found[idx] = ObservedMark(idx, f.name, f.handle)
        return MarksObserved(marks=found, clsact=clsact, names=names, errors=errors, ingress_qdisc=ingress_qdisc)

    def owns_clsact_filter(self, row) -> bool:
        """A mark program: ingress, bpf at PRIO_MARK_INGRESS, named shpdm_*."""
        return (row.parent == TC_H_INGRESS_PARENT and row.kind == "bpf" and row.prio == PRIO_MARK_INGRESS
                and row.name.startswith(PROGRAM_PREFIX))

    def diff(self, desired: MarksPlan, observed: MarksObserved) -> list[TargetDiff]:
        return [marks_plan.diff(desired, observed)] + marks_plan.blocked(desired, observed)

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        return tc.apply_ops(self.writer, diff.ops, batch=batch, codec=kernel_tc.CODEC)

    def teardown(self, observed: MarksObserved) -> list[TargetDiff]:
        return [marks_plan.diff(MarksPlan(), observed)] + [
            TargetDiff(observed.names.get(idx, str(idx)), error=err) for idx, err in sorted(observed.errors.items())]

    def stats(self, desired: MarksPlan) -> BackendStats:
        return BackendStats()  # marks enforce nothing by themselves: the uplink classes count the bytes
