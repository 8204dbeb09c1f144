"""The tenant-ingress backend: the protocol's steps for the IFB, its tree and the redirect on each shaped uplink.

Owns its IFBs (``shpi-*``, kind ifb) with everything on them, the redirect filter at prio 0x7369 of each
uplink's clsact ingress hook, and its part of the map classifier's bpffs pin scope ("ingress"). Reads the
IFBs' trees and the ingress hooks of the planned uplinks and of the uplinks its IFBs belong to (in a
reconcile not every clsact on the node: pod interfaces carry one each; before any plan, as in a
teardown, every one). An IFB that does not exist yet is created first in
its apply, and the operations waiting for its ifindex get it (``resolved``).
"""

from __future__ import annotations

import dataclasses
import errno

from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.backends.common.clsact import TC_H_CLSACT, AddClsact, describe
from shaperd.backends.common.objects import LeafQdisc, ObservedClass, ObservedFilter, RootQdisc
from shaperd.backends.ingress import diff as ingress_diff
from shaperd.backends.ingress import kernel_tc
from shaperd.backends.ingress import plan as ingress_plan
from shaperd.backends.ingress.objects import (
    IFB_KIND, INGRESS_HOOK, INGRESS_MAJOR, INGRESS_ROOT, PRIO_REDIRECT, IfbState, IngressObserved, IngressPlan,
    Redirect, UplinkState,
)
from shaperd.backends.ingress.ops import AddRedirect, CreateIfb
from shaperd.core import log
from shaperd.core.errors import KernelError
from shaperd.core.ids import ifb_name, is_ifb_name
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff
from shaperd.kernel import bpf_pins, tc
from shaperd.kernel.rtnl_rows import TC_H_ROOT


def owns_filter(row) -> bool:
    """shaperd's redirect: the uplink's clsact ingress hook, u32, at PRIO_REDIRECT."""
    return row.parent == INGRESS_HOOK and row.kind == "u32" and row.prio == PRIO_REDIRECT


class IngressBackend:
    name = "ingress"
    # What may be left on a device a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its IFB (shpi-*) with its HTB tree, and the redirect at prio 0x7369 of the uplink's ingress"

    def __init__(self, writer, pins: bpf_pins.PinStore | None = None, links=None):
        self.writer = writer  # kernel/tc.TcWriter in the node's namespace
        self.pins = pins.sub("ingress") if pins is not None else None
        # () -> [(ifindex, name)] of the node's links: the new IFB's ifindex after its creation.
        self.links = links
        # The uplinks of the last plan: their ingress hooks are read by observe. None before any plan (a
        # teardown by a fresh process): then every clsact's ingress hook is read, so a redirect whose IFB is
        # gone is found too.
        self._uplinks: set[str] | None = None
        # What was last said about others' filters deciding before the redirect (said once per change).
        self._said: dict[str, tuple] = {}
        # uplink -> (ifb, classifier path), as of the last stats() (status, one log line per change).
        self.paths: dict[str, tuple[str, str]] = {}
        # The last plan stats() saw: the metrics' tenants and their configured guarantees and limits.
        self.last: IngressPlan | None = None

    def probe(self, caps: Capabilities) -> Support:
        if not caps.htb or not caps.u32:
            return Support(False, ("tenant ingress needs sch_htb and cls_u32 (the redirect to the IFB is a u32 "
                                   "filter with a mirred action)",))
        for module, what in (("ifb", "the IFB device"), ("act_mirred", "the mirred action that feeds the IFB")):
            ev = caps.kind(module)  # the kernel's own files, where the probe could not test (qdisc_kinds.py)
            if ev is not None and ev[0] == "absent":
                return Support(False, (f"tenant ingress needs {module} ({what}), which this kernel lacks: {ev[1]}",))
        return Support(True)

    def wanted(self, ctx: PlanInput) -> bool:
        return ingress_plan.wanted(ctx.config)

    def plan(self, ctx: PlanInput) -> IngressPlan:
        p = ingress_plan.plan(ctx.config, ctx.inventory, ctx.tenancy)
        self._uplinks = {dp.uplink for dp in p.devices} | set(p.skipped)
        return p

    # ------------------------------------------------------------------ observe
    def observe(self, reads, inv: Inventory) -> IngressObserved:
        # The links read again, not the inventory's: a re-read after a failed batch must see the IFB it made.
        links = reads.links()
        qdiscs = reads.all_qdiscs()
        out = IngressObserved(names={l.ifindex: l.name for l in links})
        by_name = {l.name: l for l in links}
        roots = {q.ifindex: q for q in qdiscs if q.parent == TC_H_ROOT}
        clsact = {q.ifindex for q in qdiscs if q.kind == "clsact" and q.parent == TC_H_CLSACT}
        ingress_q = {q.ifindex for q in qdiscs if q.kind == "ingress" and q.parent == TC_H_CLSACT}
        foreign_ifbs = []
        for l in links:
            if l.kind == IFB_KIND and is_ifb_name(l.name):
                try:
                    out.ifbs[l.name] = self._ifb_state(reads, l, roots.get(l.ifindex), qdiscs, l.ifindex in clsact)
                except KernelError as e:
                    out.errors[l.name] = str(e)
            elif l.kind == IFB_KIND:
                foreign_ifbs.append(l.name)
        out.foreign_ifbs = tuple(sorted(foreign_ifbs))
        planned = self._uplinks if self._uplinks is not None else set()
        # Devices named like an IFB of a planned uplink that are not IFBs: in the way, left alone.
        for up in planned:
            other = by_name.get(ifb_name(up))
            if other is not None and other.kind != IFB_KIND:
                out.squatters[other.name] = other.kind
        # The uplinks whose ingress hook matters: the planned ones, and those shaperd's IFBs are fed from.
        fed = {l.name for l in links if ifb_name(l.name) in out.ifbs and not is_ifb_name(l.name)}
        if self._uplinks is None:
            fed |= {l.name for l in links if l.ifindex in clsact and l.kind != IFB_KIND}
        for name in sorted(planned | fed):
            l = by_name.get(name)
            if l is None:
                continue
            st = UplinkState(name, l.ifindex, clsact=l.ifindex in clsact, ingress_qdisc=l.ifindex in ingress_q)
            if st.clsact:
                try:
                    for f in reads.filters(l.ifindex, INGRESS_HOOK, name):
                        if owns_filter(f):
                            st.redirects.append(Redirect(f.prio, f.protocol, f.handle, tuple(f.keys),
                                                         getattr(f, "mirred", None)))
                        else:
                            st.foreign.append((f.prio, describe(f)))
                except KernelError as e:
                    out.errors[name] = str(e)
            out.uplinks[name] = st
        if self.pins is not None:
            try:
                out.pin_entries = self.pins.entries()
            except bpf_pins.PinError as e:
                out.pin_error = str(e)
        return out

    def _ifb_state(self, reads, link, root, qdiscs, has_clsact: bool) -> IfbState:
        st = IfbState(link.name, link.ifindex, up=link.up, clsact=has_clsact)
        if root is not None:
            st.root = RootQdisc(kind=root.kind, handle=root.handle, default_minor=root.default_minor)
        for q in qdiscs:
            if q.ifindex == link.ifindex and q.parent >> 16 == INGRESS_MAJOR and q.parent != TC_H_ROOT:
                st.leaves[q.parent] = LeafQdisc(parent=q.parent, handle=q.handle, kind=q.kind, limit=q.limit)
        if st.owned_root:
            for c in reads.htb_classes(link.ifindex, link.name):
                if c.classid >> 16 != INGRESS_MAJOR:
                    continue
                st.classes[c.classid] = ObservedClass(
                    classid=c.classid, parent=INGRESS_ROOT if c.parent == TC_H_ROOT else c.parent,
                    rate_Bps=c.rate_Bps, ceil_Bps=c.ceil_Bps, buffer_ticks=c.buffer_ticks,
                    cbuffer_ticks=c.cbuffer_ticks, quantum_bytes=c.quantum_bytes, prio=c.prio,
                    leaf_handle=c.leaf_handle)
            st.filters = [ObservedFilter(f.kind, f.prio, f.protocol, f.handle, f.parent, f.classid, f.keys, f.name,
                                         f.mark) for f in reads.filters(link.ifindex, INGRESS_ROOT, link.name)]
        if has_clsact:
            rows = reads.filters(link.ifindex, bpf_classify.TC_H_CLSACT_EGRESS, link.name)
            st.map_classifier = bpf_classify.observe(rows, link.name, self.pins, key="dst")
        return st

    def owns_clsact_filter(self, row) -> bool:
        """Only the redirect: the IFB's clsact goes with the IFB, so it is never claimed for the shared pass."""
        return owns_filter(row)

    # ------------------------------------------------------------------ diff
    def diff(self, desired: IngressPlan, observed: IngressObserved) -> list[TargetDiff]:
        self._say_foreign_first(desired, observed)
        out = []
        for td in ingress_diff.diff(desired, observed):
            err = observed.errors.get(td.target) or next(
                (observed.errors[op.device] for op in td.ops if op.device in observed.errors), None)
            if err is not None:
                td = TargetDiff(td.target, error=err)
            out.append(td)
        return out

    def _say_foreign_first(self, desired: IngressPlan, observed: IngressObserved) -> None:
        for dp in desired.devices:
            up = observed.uplinks.get(dp.uplink)
            first = tuple(d for p, d in sorted(up.foreign) if p < PRIO_REDIRECT) if up is not None else ()
            if first and self._said.get(dp.uplink) != first:
                log.get("shaperd.ingress").warning(
                    "filters of others run before shaperd's ingress redirect: packets they match are not shaped",
                    device=dp.uplink, filters=", ".join(first))
            self._said[dp.uplink] = first

    # ------------------------------------------------------------------ apply
    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        """The IFB first where it is created (its ifindex then fills in the operations waiting for it), then
        the tc writes, the map classifier's, and the redirect last."""
        ops = list(diff.ops)
        result = ApplyResult()
        creates = [op for op in ops if isinstance(op, CreateIfb)]
        if creates:
            first = tc.apply_ops(self.writer, creates, batch=False, codec=kernel_tc.CODEC)
            result.applied += first.applied
            result.failed += first.failed
            rest = [op for op in ops if not isinstance(op, CreateIfb)]
            if first.failed:
                cause = "not sent: the IFB could not be created"
                result.failed += [(op, op.error(cause)) for op in rest]
                return result
            try:
                found = {name: idx for idx, name in self._links()}
            except KernelError as e:
                result.failed += [(op, op.error(f"not sent: the new IFB's ifindex could not be read: {e}"))
                                  for op in rest]
                return result
            ops = [resolved(op, found) for op in rest]
        waiting = [op for op in ops if (op.ifindex == 0 and not bpf_classify.is_classifier_op(op))
                   or (isinstance(op, AddRedirect) and op.ifb_ifindex <= 0)]
        if waiting:  # the IFB vanished between its creation and the lookup
            result.failed += [(op, op.error("not sent: the IFB's ifindex is not known")) for op in waiting]
            ops = [op for op in ops if op not in waiting]
        clsacts = [op for op in ops if isinstance(op, AddClsact)]
        redirects = [op for op in ops if isinstance(op, AddRedirect)]
        cls_ops = [op for op in ops if bpf_classify.is_classifier_op(op)]
        tc_ops = [op for op in ops if op not in redirects and op not in cls_ops and op not in clsacts]
        if clsacts:
            # A clsact another backend added in this same reconcile (after this one's read) is the one wanted.
            res = tc.apply_ops(self.writer, clsacts, batch=False, codec=kernel_tc.CODEC)
            result.applied += res.applied + [op for op, e in res.failed if e.errno == errno.EEXIST]
            result.failed += [(op, e) for op, e in res.failed if e.errno != errno.EEXIST]
        for part, is_cls in ((tc_ops, False), (cls_ops, True), (redirects, False)):
            if not part:
                continue
            res = (bpf_classify.apply_ops(self.writer, part, self.pins) if is_cls
                   else tc.apply_ops(self.writer, part, batch=batch, codec=kernel_tc.CODEC))
            result.applied += res.applied
            result.failed += res.failed
            if res.batch_failed:
                result.batch_failed = True
                return result
            if res.failed and not is_cls and part is tc_ops:
                # The tree is not what was planned: no redirect into it until a later reconcile builds it.
                result.failed += [(op, op.error("not sent: the IFB's tree could not be written"))
                                  for op in redirects]
                return result
        return result

    def _links(self) -> list[tuple[int, str]]:
        if self.links is not None:
            return list(self.links())
        from shaperd.kernel.rtnl import RtnlReader

        with RtnlReader(self.writer.netns, run_root=self.writer.run_root) as r:
            return [(l.ifindex, l.name) for l in r.links()]

    # ------------------------------------------------------------------ teardown, stats, render
    def teardown(self, observed: IngressObserved) -> list[TargetDiff]:
        return ingress_diff.teardown(observed)

    def stats(self, desired: IngressPlan) -> BackendStats:
        paths = {dp.uplink: (dp.ifb, dp.classifier_path) for dp in desired.devices}
        for up, (ifb, path) in sorted(paths.items()):
            if self.paths.get(up) != (ifb, path):
                how = ("eBPF map classifier (destination-keyed) on the IFB's clsact egress" if path == "ebpf"
                       else "u32 destination filters on the IFB's root")
                log.get("shaperd.ingress").info("tenant ingress", device=up, ifb=ifb, path=path, detail=how)
        self.paths = paths
        self.last = desired
        return BackendStats(devices=tuple(dp.ifb for dp in desired.devices))

    def render(self, desired: IngressPlan) -> str:
        from shaperd.backends.ingress.render import render

        return render(desired)


def resolved(op, found: dict[str, int]):
    """``op`` with the ifindex of a device created in this apply filled in (0 until then)."""
    if op.ifindex == 0 and op.device in found:
        op = dataclasses.replace(op, ifindex=found[op.device])
    if isinstance(op, AddRedirect) and op.ifb_ifindex <= 0 and op.ifb in found:
        op = dataclasses.replace(op, ifb_ifindex=found[op.ifb])
    return op

