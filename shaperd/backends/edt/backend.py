"""The edt backend: the protocol's six steps for mq + sch_fq + the stamper on each edt uplink.

Owns the root qdisc 7365: (mq, or sch_fq on a single-queue device), the
sch_fq under each mq class, and its stamper filter on clsact egress (prio
PRIO_STAMPER). Shares clsact with the map classifier and others (adds it;
only a teardown removes it, where it held nothing but shaperd's filters:
backends/common/clsact.py). Plans only the devices tenancy.dataplanes gives to edt;
the tenants' rates inside the stamper's maps are the rate controller's
(shaperd/backends/edt/loop.py), not the reconcile's, so a resync never resets
them; the capped pods' keys there (parent and static rate) are the
reconcile's, read back and diffed like any other object.
With bpffs pins, each stamper is pinned when loaded under the "edt-stamper"
part of the scope (the controller reopens its maps there without
CAP_SYS_ADMIN); this backend collects the entries of devices no longer on edt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shaperd.core import log
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.kernel import bpf, bpf_pins
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.kernel import tc
from shaperd.backends.edt import kernel_tc
from shaperd.kernel.rtnl_rows import TC_H_ROOT
from shaperd.core.protocol import ApplyResult, BackendStats, PlanInput, Support, TargetDiff, planned_diffs
from shaperd.backends.common import mapcls
from shaperd.backends.common.mapcls import stale_pins
from shaperd.backends.common.clsact import TC_H_CLSACT
from shaperd.backends.edt.diff import diff_device, diff_teardown, stale_stamper_pins
from shaperd.backends.edt.ops import ClearPodKey, DeleteRoot, SetFq, SetPodKey, SetRoot, UnpinStamper
from shaperd.backends.edt.refusals import Refusals, first_refusal, refusal_of
from shaperd.backends.edt.objects import (
    EDT_MAJOR, PRIO_STAMPER, ROOT_HANDLE, STAMPER_HANDLE, STAMPER_PREFIX, EdtDeviceState, FqQdisc,
)
from shaperd.backends.edt.plan import EdtPlan, plan
from shaperd.core.dataplane import edt_missing

TC_H_EGRESS_PARENT = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)


@dataclass
class EdtObserved:
    devices: dict[int, EdtDeviceState] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    # Entries under edt's part of the bpffs pin scope; None without pins or unreadable.
    pin_entries: list[str] | None = None
    # Entries under the stampers' part (edt-stamper); None without pins or unreadable.
    stamper_pin_entries: list[str] | None = None
    # Why either pin scope could not be listed: a teardown fails on it.
    pin_errors: dict[str, str] = field(default_factory=dict)


def device_states(reads, inv: Inventory, pins: bpf_pins.PinStore | None = None,
                  stamper_pins: bpf_pins.PinStore | None = None, open_stamper=None) -> EdtObserved:
    """Each link's root, edt's sch_fq children, clsact, and the stamper filter where clsact exists, with the
    capped pods' entries in its maps (opened as the rate controller opens them: ``stamper_pins``, else by id)."""
    qdiscs = reads.all_qdiscs()
    out = EdtObserved()
    by_idx = {l.ifindex: EdtDeviceState(l.name, l.ifindex) for l in inv.links}
    for q in qdiscs:
        st = by_idx.get(q.ifindex)
        if st is None:
            continue
        if q.parent == TC_H_ROOT:
            st.root_kind, st.root_handle = q.kind, q.handle
        elif q.kind == "clsact" and q.parent == TC_H_CLSACT:
            st.clsact = True
        if q.kind == "fq" and q.fq is not None and (q.parent == TC_H_ROOT or q.parent >> 16 == EDT_MAJOR):
            limit, flow, horizon_us, drop = q.fq
            st.fqs[q.parent] = FqQdisc(q.parent, q.handle, limit, flow, horizon_us, bool(drop))
    for st in by_idx.values():
        if not st.owned:
            st.fqs = {}
        if not st.clsact:
            continue
        try:
            rows = reads.filters(st.ifindex, TC_H_EGRESS_PARENT, st.device)
            for f in rows:
                if f.kind == "bpf" and f.prio == PRIO_STAMPER:
                    st.stamper_name, st.stamper_prog_id = f.name, f.prog_id
            st.map_classifier = bpf_classify.observe(rows, st.device, pins)
        except KernelError as e:
            out.errors[st.ifindex] = str(e)
            continue
        if st.stamper_name is not None:
            read_pod_entries(st, stamper_pins, open_stamper or edt_prog.open_attached)
    out.devices = by_idx
    return out


def read_pod_entries(st: EdtDeviceState, pins, open_stamper) -> None:
    """The attached stamper's pod keys into ``st.pod_entries``, or why not into ``st.maps_error``."""
    if not st.stamper_prog_id or not st.stamper_name.startswith(STAMPER_PREFIX):
        st.maps_error = f"filter {st.stamper_name or '?'} at the stamper's prio carries no program of shaperd's"
        return
    try:
        with open_stamper(st.device, st.stamper_prog_id, pins) as maps:
            st.pod_entries = edt_prog.read_pod_entries(maps)
    except (bpf.BpfError, OSError) as e:
        st.maps_error = f"read edt stamper maps on {st.device}: {e}"


class EdtBackend:
    name = "edt"
    # What may be left on a device a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its stamper and the map classifier on clsact egress"

    def __init__(self, writer, take_over: bool = False, pins: bpf_pins.PinStore | None = None,
                 stamper_pins: bpf_pins.PinStore | None = None):
        self.writer = writer
        self.take_over = take_over
        # The map classifier on edt uplinks is adopted through these bpffs pins (None: by id).
        self.pins = pins.sub("edt") if pins is not None else None
        # The stampers' programs and maps are pinned here when loaded; the rate controller reopens them.
        # (Given apart where the probe got a stamper back through pins but refused the map classifier.)
        self.stamper_pins = stamper_pins or (pins.sub(edt_prog.STAMPER_PINS) if pins is not None else None)
        # Devices whose kernel refused sch_fq/mq at apply: on htb until restart or the device goes away.
        self.refusals = Refusals()
        # (device, prog_id, pins) -> the attached stamper's StamperMaps: observe reads the capped pods' keys,
        # apply writes them (tests inject a fake).
        self.open_stamper = edt_prog.open_attached

    def probe(self, caps: Capabilities) -> Support:
        missing = edt_missing(caps)
        if missing:
            # Enabled anyway: it plans nothing (tenancy gives every uplink to htb) but still removes its own state.
            return Support(True, (f"edt unavailable: {', '.join(missing)}",))
        return Support(True)

    def plan(self, ctx: PlanInput) -> EdtPlan:
        return plan(ctx.config, ctx.inventory, ctx.tenancy, self.take_over, ctx.refused.get(self.name))

    def refused(self, inv: Inventory) -> dict[str, tuple[int, str]]:
        """Devices where the kernel refused edt (device -> (ifindex, reason)); gone or recreated ones forgotten."""
        return self.refusals.current(inv)

    def observe(self, reads, inv: Inventory) -> EdtObserved:
        out = device_states(reads, inv, self.pins, self.stamper_pins, self.open_stamper)
        if self.pins is not None:
            try:
                out.pin_entries = self.pins.entries()
            except bpf_pins.PinError as e:
                out.pin_errors["edt bpffs pins"] = str(e)  # not collected this time
        if self.stamper_pins is not None:
            try:
                out.stamper_pin_entries = self.stamper_pins.entries()
            except bpf_pins.PinError as e:
                out.pin_errors["edt stamper bpffs pins"] = str(e)  # not collected this time
        return out

    def owns_clsact_filter(self, row) -> bool:
        """The stamper (egress, its prio, handle and name prefix), or the map classifier edt uplinks carry."""
        return mapcls.owns_clsact_filter(row) or (
            row.parent == TC_H_EGRESS_PARENT and row.kind == "bpf" and row.prio == PRIO_STAMPER
            and row.handle == STAMPER_HANDLE and row.name.startswith(STAMPER_PREFIX))

    def diff(self, desired: EdtPlan, observed: EdtObserved) -> list[TargetDiff]:
        out = planned_diffs(desired.devices, observed, lambda dp, st: diff_device(dp, st, desired.take_over))
        keep = {dp.device for dp in desired.devices} | set(desired.skipped)
        for st in sorted(observed.devices.values(), key=lambda s: s.ifindex):
            if st.device in keep or not (st.owned or st.stamper_name):
                continue
            # HTB takes a device back by replacing the root itself; edt removes only its stamper there.
            td = diff_teardown(st, keep_root=st.device in desired.htb_devices,
                               reason="device no longer on the edt data plane")
            if td.ops:
                out.append(td)
        keep_pins = {dp.device for dp in desired.devices if dp.map_classifier is not None} | set(desired.skipped)
        out.extend(stale_pins(observed.pin_entries, keep_pins,
                              "no edt device with the eBPF map classifier by that name"))
        out.extend(stale_stamper_pins(observed.stamper_pin_entries, {dp.device for dp in desired.devices}
                                      | set(desired.skipped), "device no longer on the edt data plane"))
        return out

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        # tc objects first (root, clsact, stamper), then a capped pod's new entries, then the map classifier's
        # writes (as the htb backend does), then the entries of pods gone: the classifier sends a pod's packets
        # to its key only once the key is set up, and away from it before it is cleared.
        unpins = [op for op in diff.ops if isinstance(op, UnpinStamper)]
        pod_sets = [op for op in diff.ops if isinstance(op, SetPodKey)]
        pod_clears = [op for op in diff.ops if isinstance(op, ClearPodKey)]
        tc_ops = [op for op in diff.ops if not bpf_classify.is_classifier_op(op)
                  and not isinstance(op, (UnpinStamper, SetPodKey, ClearPodKey))]
        cls_ops = [op for op in diff.ops if bpf_classify.is_classifier_op(op)]
        if not batch:  # one by one: the qdiscs first, so a kernel that does not know a kind is caught before the rest
            qdisc_ops = [op for op in tc_ops if isinstance(op, (SetRoot, SetFq))]
            first = tc.apply_ops(self.writer, qdisc_ops, batch=False, codec=kernel_tc.CODEC)
            reason = first_refusal(first.failed)
            if reason is not None:
                return self._refuse(diff, qdisc_ops, first, reason)
            tc_ops = [op for op in tc_ops if op not in qdisc_ops]
        result = tc.apply_ops(self.writer, tc_ops, batch=batch, pins=self.stamper_pins, codec=kernel_tc.CODEC)
        if not batch:
            result.applied[:0], result.failed[:0] = first.applied, first.failed
        for group, apply_group in ((pod_sets, self._apply_pods), (cls_ops, self._apply_classifier),
                                   (pod_clears, self._apply_pods)):
            if group and not result.batch_failed:
                more = apply_group(group)
                result.applied.extend(more.applied)
                result.failed.extend(more.failed)
        if unpins and not result.batch_failed:
            more = edt_prog.apply_unpins(unpins, self.stamper_pins)
            result.applied.extend(more.applied)
            result.failed.extend(more.failed)
        return result

    def _apply_pods(self, ops) -> ApplyResult:
        return edt_prog.apply_pod_ops(ops, self.stamper_pins, self.open_stamper)

    def _apply_classifier(self, ops) -> ApplyResult:
        return bpf_classify.apply_ops(self.writer, ops, self.pins)

    def _refuse(self, diff: TargetDiff, qdisc_ops: list, first: ApplyResult, reason: str) -> ApplyResult:
        """The kernel does not know sch_fq (or mq): undo this apply's root, remember the device, warn once.

        The refused writes are not reported as failures: the device is not left unenforced, the next plan
        (the engine reconciles again at once) puts it on htb, which replaces whatever edt root is left and
        takes over the map classifier; edt's teardown of the device there removes a stamper an earlier
        batch may have attached."""
        dev, idx = diff.target, qdisc_ops[0].ifindex
        root_failed = any(isinstance(op, SetRoot) for op, _e in first.failed)
        undo = [] if root_failed else [DeleteRoot(handle=ROOT_HANDLE, device=dev, ifindex=idx,
                                                  reason="edt refused by the kernel: back to htb")]
        failed = [(op, e) for op, e in first.failed if refusal_of(op, e) is None]
        if undo:
            done = tc.apply_ops(self.writer, undo, batch=False, codec=kernel_tc.CODEC)
            first.applied.extend(done.applied)
            failed.extend(done.failed)
        if self.refusals.add(dev, idx, reason):
            log.get("shaperd.edt").warning("edt refused; the device goes to htb", device=dev, reason=reason)
        return ApplyResult(applied=first.applied, failed=failed)

    def teardown(self, observed: EdtObserved) -> list[TargetDiff]:
        out = []
        for st in sorted(observed.devices.values(), key=lambda s: s.ifindex):
            td = diff_teardown(st)  # the root is known from the qdisc dump even where the filters were not read
            td.error = observed.errors.get(st.ifindex)
            out.append(td)
        out += stale_pins(observed.pin_entries, set(), "teardown")
        out += stale_stamper_pins(observed.stamper_pin_entries, set(), "teardown")
        return out + [TargetDiff(where, error=err) for where, err in sorted(observed.pin_errors.items())]

    def render(self, desired: EdtPlan) -> str:
        from shaperd.backends.edt.render import render

        return render(desired)

    def stats(self, desired: EdtPlan) -> BackendStats:
        # The per-tenant counters of edt live in the stamper's maps (edt_loop reads them), not in tc classes.
        return BackendStats(devices=tuple(dp.device for dp in desired.devices))


__all__ = ["EdtBackend", "EdtObserved", "ROOT_HANDLE", "device_states"]
