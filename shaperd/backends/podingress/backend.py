"""The podingress backend: the protocol's steps for the tbf ingress caps on capped pods' host interfaces.

Plans from Tenancy.pod_caps (plan.py), reads every root qdisc from the reconcile's one qdisc dump and the
``ingress`` qdisc's filters on the planned interfaces (the CNI plugin's IFB), diffs (diff.py: ownership
lives there) and applies through the node's tc writer with its own codec (kernel_tc.py).

Two things it keeps in memory, as data for the next plan and for reporting, never as ownership: each
capped pod's last host interface (a pod whose interface is briefly unresolved keeps its qdisc instead of
losing it and getting it back; at start, from the labels record its predecessor wrote), and the last plan
(for the metrics and the labels record). The process that
applies writes the labels record (labels.py) that ``shaperd status`` and ``top`` read; a teardown removes it.
"""

from __future__ import annotations

import errno
from pathlib import Path

from shaperd.core import log
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.kernel import tc
from shaperd.backends.podingress import diff as pdiff
from shaperd.backends.podingress import kernel_tc, labels
from shaperd.backends.podingress import plan as pplan
from shaperd.backends.podingress.objects import (INGRESS_FILTER_PARENT, INGRESS_KIND, TC_H_ROOT, CniEgress,
                                                 ObservedRoot, PodIngressObserved, PodIngressPlan)
from shaperd.backends.podingress.render import render as render_plan


class PodIngressBackend:
    name = "podingress"
    # What may be left on an interface a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its tbf 7368: root qdiscs on pod interfaces"

    def __init__(self, writer, take_over: bool = False, record: Path | None = None, netns: str | None = None,
                 run_root: str = "/run"):
        self.writer = writer
        self.take_over = take_over
        self.record = record  # the labels file (labels.py); None: none is written
        self.netns, self.run_root = netns, run_root
        self.log = log.get("shaperd.podingress")
        self.snapshot = PodIngressPlan()  # the last plan (metrics, labels)
        self.planned = False  # False in a process that never planned (a teardown)
        # pod uid -> (ifindex, ifname) it was last planned on; a restarted agent starts from the labels its
        # predecessor recorded, so a pod unresolved at the first reconcile keeps its cap too.
        self._where: dict[str, tuple[int, str]] = {
            lab["uid"]: (idx, lab["device"]) for idx, lab in (labels.read(record) if record else {}).items()
            if isinstance(lab.get("uid"), str) and isinstance(lab.get("device"), str)}
        self._recorded: list[dict] | None = None
        self._said: set[tuple[int, tuple[str, ...]]] = set()  # CNI egress findings already logged

    def probe(self, caps: Capabilities) -> Support:
        return Support(True)  # tbf is in every kernel shaperd runs on; a refusal is that interface's error

    def wanted(self, ctx: PlanInput) -> bool:
        return any(c.ingress_bps is not None for c in ctx.tenancy.pod_caps.values())

    def plan(self, ctx: PlanInput) -> PodIngressPlan:
        p = pplan.plan(ctx.config, ctx.inventory, ctx.tenancy, self.take_over, dict(self._where))
        held = {h.ref for h in p.held}
        held_uids = {pod.uid for pod in ctx.inventory.pods if pod.ref in held}
        keep = {uid: w for uid, w in self._where.items() if uid in held_uids}
        self._where = {**keep, **{x.uid: (x.ifindex, x.ifname) for x in p.pods}}
        self.snapshot, self.planned = p, True
        return p

    def observe(self, reads, inv: Inventory) -> PodIngressObserved:
        names = {l.ifindex: l.name for l in inv.links}
        out = PodIngressObserved(names=names)
        try:
            qdiscs = reads.all_qdiscs()
        except KernelError as e:
            out.error = str(e)
            return out
        planned = {p.ifindex for p in self.snapshot.pods} if self.planned else set()
        for q in qdiscs:
            if q.parent == TC_H_ROOT:
                out.roots[q.ifindex] = ObservedRoot(q.ifindex, q.kind, q.handle, q.tbf, q.counters)
            elif q.kind == INGRESS_KIND and q.ifindex in planned:
                out.ingress[q.ifindex] = self._cni_egress(reads, q.ifindex, names)
        self._say(out)
        return out

    @staticmethod
    def _cni_egress(reads, ifindex: int, names: dict[int, str]) -> CniEgress:
        try:
            filters = reads.filters(ifindex, INGRESS_FILTER_PARENT, names.get(ifindex, str(ifindex)))
        except KernelError as e:
            if e.errno == errno.ENODEV:  # gone between the two dumps: nothing to say
                return CniEgress(ifindex)
            return CniEgress(ifindex, error=str(e))
        targets = dict.fromkeys(f.mirred[1] for f in filters if f.mirred is not None)  # (eaction, ifindex)
        return CniEgress(ifindex, tuple(names.get(i, f"ifindex {i}") for i in targets))

    def _say(self, observed: PodIngressObserved) -> None:
        """Log each CNI plugin egress setup once, when first seen (it is never touched; status shows it)."""
        by_if = {p.ifindex: p for p in self.snapshot.pods}
        now = set()
        for idx, cni in sorted(observed.ingress.items()):
            key = (idx, cni.ifbs)
            now.add(key)
            if key not in self._said and idx in by_if:
                self.log.warning("left alone", device=by_if[idx].ifname, reason=pdiff.cni_note(by_if[idx], cni))
        self._said = now

    def diff(self, desired: PodIngressPlan, observed: PodIngressObserved) -> list[TargetDiff]:
        return pdiff.diff(desired, observed)

    def apply(self, td: TargetDiff, batch: bool = True) -> ApplyResult:
        res = tc.apply_ops(self.writer, td.ops, batch=batch, codec=kernel_tc.CODEC)
        self._write_record()
        return res

    def _write_record(self) -> None:
        """The labels of the last plan for status and top; none (the file removed) after a teardown."""
        if self.record is None:
            return
        rows = labels.rows(self.snapshot) if self.planned else []
        if rows == self._recorded:
            return
        try:
            labels.write(self.record, rows)
            self._recorded = rows
        except OSError as e:
            self.log.warning("pod ingress labels not recorded for shaperd status", file=str(self.record),
                             error=e.strerror or str(e))

    def teardown(self, observed: PodIngressObserved) -> list[TargetDiff]:
        # "Nothing desired" is also what this backend remembers from here on: the labels record goes with the
        # removals (apply writes it empty), the metrics have no pod left.
        self.snapshot, self.planned = PodIngressPlan(), False
        return pdiff.teardown(observed)

    def stats(self, desired: PodIngressPlan) -> BackendStats:
        return BackendStats(devices=tuple(p.ifname for p in desired.pods))

    def render(self, desired: PodIngressPlan) -> str:
        return render_plan(desired)
