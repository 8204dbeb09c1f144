"""The HTB backend: the protocol's six steps for the tree on each uplink.

Owns the root qdisc 7368: and everything under it on the devices it shapes;
garbage-collects its tree from devices no longer selected (not from those
merely failing to plan, which keep what they have); keeps the capped pods'
labels file for status (podlabels.py) where it writes the tree; and, where the map
classifier is adopted through bpffs pins, its pin entries of devices that no
longer use it (gone, renamed, deselected, u32 path) and a crash's leftovers.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

from shaperd.core import log
from shaperd.core.errors import KernelError
from shaperd.core.inventory import Capabilities, Inventory
from shaperd.backends.common import kernel_classifier as bpf_classify
from shaperd.kernel import bpf_pins
from shaperd.kernel import tc
from shaperd.backends.htb import kernel_tc
from shaperd.core.protocol import ApplyResult, BackendStats, ClassTarget, PlanInput, Support, TargetDiff, planned_diffs
from shaperd.backends.htb import observe as obs
from shaperd.backends.htb import podlabels
from shaperd.backends.htb.diff import diff_device, diff_teardown
from shaperd.backends.common import mapcls
from shaperd.backends.common.mapcls import stale_pins
from shaperd.backends.common.objects import DeviceState
from shaperd.backends.htb.ops import ChangeClass, CreateClass, CreateRoot, SetLeaf
from shaperd.backends.htb.plan import HtbPlan, HtbSettings, plan


@dataclass
class HtbObserved:
    """Every link's root qdisc, and the full tree where it is shaperd's."""

    devices: dict[int, DeviceState] = field(default_factory=dict)
    # ifindex -> why that device could not be read.
    errors: dict[int, str] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    # Entries under the bpffs pin scope (device names, crash leftovers); None without pins or unreadable.
    pin_entries: list[str] | None = None
    # Why the pin scope could not be listed (pin_entries is None then): a teardown fails on it.
    pin_error: str | None = None


class OffloadRefused(KernelError):
    """The kernel or driver refused an offloaded HTB root or class on a device.

    The reconciler plans and applies again at once (``refused``, engine/fallback.py), and that plan is
    software HTB for the device. Still transient for the daemon (unlike the EINVAL or EOPNOTSUPP it
    carries): should a report keep it, the short backoff, not the resync, runs the next reconcile."""

    @property
    def transient(self) -> bool:
        return True


# Answers that mean "this offloaded tree is not accepted here" (sch_htb.c htb_init/htb_change_class, mlx5
# en/qos.c): EOPNOTSUPP (no hw-tc-offload, driver without TC_SETUP_QDISC_HTB), EINVAL (prio/quantum,
# firmware), ENOSPC (leaf limit), ERANGE.
OFFLOAD_REFUSALS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSPC, errno.ERANGE})


class HtbBackend:
    name = "htb"
    # What may be left on a device a teardown could not read (engine/teardown.py words the failure).
    teardown_remains = "its root qdisc 7368: with its classes, leaves and filters, and its map classifier"

    def __init__(self, writer, settings: HtbSettings = HtbSettings(), take_over: bool = False,
                 pins: bpf_pins.PinStore | None = None, labels_file: Path | None = None):
        self.writer = writer  # pyroute2 IPRoute, created by kernel.tc.open_writer in the node's namespace
        self.settings = settings
        self.take_over = take_over
        # The map classifier is adopted through these bpffs pins (None: by id); htb's own part of the scope.
        self.pins = pins.sub("htb") if pins is not None else None
        # device -> "ebpf" | "u32", as of the last stats() (status, metrics, one log line per change).
        self.classifier_paths: dict[str, str] = {}
        # (ifindex, device) -> the kernel's refusal of htb offload there: planned in software from then on,
        # forgotten when that device goes away (new ifindex or name) or the daemon restarts. No retry loop.
        self.offload_refused: dict[tuple[int, str], str] = {}
        # (ifindex, device) planned with an offloaded root by the last plan().
        self._offloaded: set[tuple[int, str]] = set()
        # device -> (offloaded, why), as of the last stats() (status, metrics, one log line per change).
        self.offload: dict[str, tuple[bool, str]] = {}
        # Who the capped pods' classes are for (podlabels.py), as planned and as last written for status.
        self.labels_file = labels_file
        self._labels: dict = {}
        self._labels_recorded: dict | None = None

    def probe(self, caps: Capabilities) -> Support:
        if not caps.htb:
            return Support(False, ("sch_htb missing: no tenant can be shaped on this kernel",))
        return Support(True)

    def refused(self, inv: Inventory | None) -> dict[str, tuple[int, str]]:
        """Devices whose kernel refused htb offload (device -> (ifindex, reason)), the protocol's optional
        refusal report (engine/fallback.py): a new one makes the reconciler plan and apply again at once,
        so the device gets its software tree in the same reconcile. With ``inv``, gone devices are forgotten."""
        if inv is not None:
            present = {(l.ifindex, l.name) for l in inv.links}
            self.offload_refused = {k: v for k, v in self.offload_refused.items() if k in present}
        return {dev: (idx, why) for (idx, dev), why in sorted(self.offload_refused.items())}

    def plan(self, ctx: PlanInput) -> HtbPlan:
        self.refused(ctx.inventory)
        p = plan(ctx.config, ctx.inventory, self.settings, ctx.tenancy, self.take_over, dict(self.offload_refused))
        self._offloaded = {(dp.ifindex, dp.device) for dp in p.devices if dp.root.offload}
        self._labels = podlabels.doc_of(p)
        return p

    def _record_labels(self) -> None:
        """Keep ``labels_file`` equal to the planned pod classes (written where the tree is written: apply)."""
        if self.labels_file is None or self._labels == self._labels_recorded:
            return
        try:
            podlabels.record(self.labels_file, self._labels)
            self._labels_recorded = self._labels
        except OSError as e:
            log.get("shaperd.htb").warning("capped pods' labels not recorded for shaperd status",
                                           file=str(self.labels_file), error=str(e))

    def _offload_refusals(self, result: ApplyResult) -> None:
        """Remember a refused offload per device (the first refusal's text) and say so; mark the errors."""
        for i, (op, err) in enumerate(result.failed):
            key = (op.ifindex, op.device)
            offloaded = (isinstance(op, CreateRoot) and op.root.offload) or (
                key in self._offloaded and isinstance(op, (CreateClass, ChangeClass, SetLeaf)))
            if not offloaded or err.errno not in OFFLOAD_REFUSALS:
                continue
            if key not in self.offload_refused:
                self.offload_refused[key] = err.cause
                log.get("shaperd.htb").warning("htb offload refused; falling back to software HTB", device=op.device,
                                               operation=op.describe(), error=err.cause)
            result.failed[i] = (op, OffloadRefused(err.verb, err.obj, err.device,
                                                   f"{err.cause} (htb offload refused: the next plan is software HTB)",
                                                   err.errno))

    def observe(self, reads, inv: Inventory) -> HtbObserved:
        qdiscs = reads.all_qdiscs()
        out = HtbObserved(names={l.ifindex: l.name for l in inv.links})
        owned = obs.owned_ifindexes(qdiscs)
        for link in inv.links:
            try:
                if link.ifindex in owned:
                    st = obs.device_state(reads, link.name, link.ifindex, qdiscs)
                    if any(q.ifindex == link.ifindex and q.kind == "clsact" for q in qdiscs):
                        st.map_classifier = bpf_classify.observe(
                            reads.filters(link.ifindex, bpf_classify.TC_H_CLSACT_EGRESS, link.name), link.name,
                            self.pins)
                    out.devices[link.ifindex] = st
                else:  # only the root matters where the tree is not ours: no further dump
                    out.devices[link.ifindex] = obs.device_state(None, link.name, link.ifindex, qdiscs)
            except KernelError as e:
                out.errors[link.ifindex] = str(e)
        if self.pins is not None:
            try:
                out.pin_entries = self.pins.entries()
            except bpf_pins.PinError as e:
                out.pin_error = str(e)
                log.get("shaperd.htb").warning("bpffs pins unreadable: not collected", error=str(e))
        return out

    def owns_clsact_filter(self, row) -> bool:
        return mapcls.owns_clsact_filter(row)

    def diff(self, desired: HtbPlan, observed: HtbObserved) -> list[TargetDiff]:
        out = planned_diffs(desired.devices, observed, lambda dp, st: diff_device(dp, st, desired.take_over))
        # Garbage: our tree on devices no longer selected (not on those merely failing to plan).
        keep = {dp.device for dp in desired.devices} | set(desired.skipped)
        for st in sorted(observed.devices.values(), key=lambda s: s.ifindex):
            if st.owned and st.device not in keep:
                out.append(diff_teardown(st, "device no longer selected by node.interfaces"))
        # Pins of devices that no longer carry the map classifier (those failing to plan keep theirs).
        keep_pins = {dp.device for dp in desired.devices if dp.map_classifier is not None} | set(desired.skipped)
        out.extend(stale_pins(observed.pin_entries, keep_pins,
                              "no device shaped with the eBPF map classifier by that name"))
        return out

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        self._record_labels()
        # tc objects first (the classes the classifier points at), then the map classifier's writes.
        tc_ops = [op for op in diff.ops if not bpf_classify.is_classifier_op(op)]
        cls_ops = [op for op in diff.ops if bpf_classify.is_classifier_op(op)]
        first = next((i for i, op in enumerate(tc_ops) if isinstance(op, CreateRoot) and op.root.offload), None)
        if not batch and first is not None:
            # One by one: the offloaded root first; refused, the tree under it is not sent (it would only
            # fail, once per class): the next plan, a moment later, is software HTB for this device.
            result = tc.apply_ops(self.writer, tc_ops[:first + 1], batch=False, codec=kernel_tc.CODEC)
            self._offload_refusals(result)
            root_failed = next((e for op, e in result.failed if op is tc_ops[first]), None)
            if isinstance(root_failed, OffloadRefused):
                cause = f"not sent: htb offload was refused on {diff.target} (the next plan is software HTB)"
                result.failed += [(op, OffloadRefused(op.verb, op.what(), op.device, cause, root_failed.errno))
                                  for op in tc_ops[first + 1:] + cls_ops]
                return result
            rest = tc.apply_ops(self.writer, tc_ops[first + 1:], batch=False, codec=kernel_tc.CODEC)
            self._offload_refusals(rest)
            result.applied.extend(rest.applied)
            result.failed.extend(rest.failed)
        else:
            result = tc.apply_ops(self.writer, tc_ops, batch=batch, codec=kernel_tc.CODEC)
            self._offload_refusals(result)
        if cls_ops and not result.batch_failed:
            more = bpf_classify.apply_ops(self.writer, cls_ops, self.pins)
            result.applied.extend(more.applied)
            result.failed.extend(more.failed)
        return result

    def teardown(self, observed: HtbObserved) -> list[TargetDiff]:
        out = [diff_teardown(st) for st in sorted(observed.devices.values(), key=lambda s: s.ifindex)]
        out += [TargetDiff(observed.names.get(idx, str(idx)), error=err)
                for idx, err in sorted(observed.errors.items())]
        out += stale_pins(observed.pin_entries, set(), "teardown")
        if observed.pin_error is not None:
            out.append(TargetDiff("htb bpffs pins", error=observed.pin_error))
        return out

    def stats(self, desired: HtbPlan) -> BackendStats:
        out = BackendStats(devices=tuple(dp.device for dp in desired.devices))
        paths = {dp.device: dp.classifier_path for dp in desired.devices}
        for dev, path in sorted(paths.items()):
            if self.classifier_paths.get(dev) != path:
                how = ("eBPF map classifier on clsact egress (LPM trie source prefixes)" if path == "ebpf"
                       else "u32 filters and classic cls_bpf on the HTB root")
                log.get("shaperd.htb").info("classifier path", device=dev, path=path, detail=how)
        self.classifier_paths = paths
        offload = {dp.device: (dp.root.offload, dp.offload_why) for dp in desired.devices}
        for dev, (on, why) in sorted(offload.items()):
            if self.offload.get(dev) != (on, why):
                log.get("shaperd.htb").info("htb offload", device=dev, offload="on" if on else "off", why=why)
        self.offload = offload
        for dp in desired.devices:
            by_id = {c.classid: c for c in dp.classes}
            for tenant, cid in dp.tenant_classes.items():
                c = by_id.get(cid)
                if c is not None:
                    out.targets[(dp.device, cid)] = ClassTarget(tenant, dp.device, cid, c.rate_bps, c.ceil_bps)
            for p in desired.pods:  # capped pods' own classes: shaperd_pod_transmit_* (report/collectors.py)
                c = by_id.get(p.classid)
                if c is not None:
                    out.targets[(dp.device, p.classid)] = ClassTarget(p.tenant or "", dp.device, p.classid,
                                                                      c.rate_bps, c.ceil_bps, pod=p.ref)
        out.endpoints = {t: {"cidr": n, "interface": 0, "cgroup": 0} for t, n in desired.tenant_cidrs.items()}
        # The interface and cgroup mappings are the same on every shaped device: count the first.
        for dp in desired.devices[:1]:
            owner = {cid: name for name, cid in dp.tenant_classes.items()}
            for f in dp.filters:
                kind = getattr(f, "kind", None)
                if kind not in ("ifindex", "cgroup"):
                    continue
                for entry in f.mapping:
                    tenant = owner.get(entry[-1])
                    if tenant is not None:
                        out.endpoints[tenant]["interface" if kind == "ifindex" else "cgroup"] += 1
            mc = dp.map_classifier
            if mc is not None:  # the eBPF path carries the same mapping as map entries
                for role, kind in (("ifindex", "interface"), ("cgroup", "cgroup")):
                    for val in mc.entries.get(role, {}).values():
                        tenant = owner.get(int.from_bytes(val, "little"))
                        if tenant is not None:
                            out.endpoints[tenant][kind] += 1
        return out
