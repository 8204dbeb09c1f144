"""The edt backend's pure diff: desired mq/fq/stamper vs what the kernel holds -> typed operations.

Ownership: the root is edt's when it is 7365: (mq or fq). A kernel default
root (noqueue, pfifo_fast, an unnamed mq, fq_codel, fq, pfifo) and shaperd's
own HTB tree (7368:, when a device moves from htb to edt) are replaced; any
other root belongs to someone else and blocks the device unless take_over.
clsact is shared (the map classifier and other agents use it): added if
missing, never deleted. Only the stamper's own filter (its prio) is edt's.
Inside the attached stamper's maps, the rates and clocks of tenants are the
rate controller's (never diffed here); a capped pod's key (its parent and its
static rate) is the backend's: written where it differs, cleared when no
capped pod has it.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.backends.common.objects import DEFAULT_ROOT_KINDS, ROOT_HANDLE as HTB_ROOT_HANDLE
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.common import mapcls
from shaperd.backends.edt import plan as planmod
from shaperd.backends.edt.objects import PRIO_STAMPER, ROOT_HANDLE, EdtDevicePlan, EdtDeviceState
from shaperd.backends.edt.ops import (
    ClearPodKey, DeleteRoot, DeleteStamper, SetFq, SetPodKey, SetRoot, SetStamper, UnpinStamper,
)
from shaperd.core.units import format_rate


def replaceable(st: EdtDeviceState) -> bool:
    """Same rule as HTB's (kernel defaults by kind), plus shaperd's own HTB root."""
    if st.root_kind is None or st.owned or st.root_kind in DEFAULT_ROOT_KINDS:
        return True
    return st.root_kind == "htb" and st.root_handle == HTB_ROOT_HANDLE


def diff_device(dp: EdtDevicePlan, st: EdtDeviceState, take_over: bool = False) -> TargetDiff:
    td = TargetDiff(dp.device)
    kw = dict(device=dp.device, ifindex=dp.ifindex)
    if not replaceable(st) and not take_over:
        td.blocked = (f"root qdisc {st.root_kind} {st.root_handle >> 16:x}: is not shaperd's; left alone "
                      "(node.takeOver or --take-over replaces it)")
        return td
    root_ok = st.owned and st.root_kind == dp.root_kind
    if dp.root_kind == "mq":
        if not root_ok:
            td.ops.append(SetRoot(kind="mq", handle=ROOT_HANDLE, reason="edt: mq root, one sch_fq per TX queue", **kw))
        for fq in dp.fqs:
            if not root_ok or st.fqs.get(fq.parent) != fq:
                td.ops.append(SetFq(fq=fq, reason=f"sized for {dp.capacity_bps // 1_000_000} Mbit/s", **kw))
    else:
        fq = dp.fqs[0]
        if not root_ok or st.fqs.get(fq.parent) != fq:
            td.ops.append(SetRoot(kind="fq", handle=ROOT_HANDLE, fq=fq, reason="edt: single TX queue", **kw))
    if not st.clsact:
        td.ops.append(AddClsact(reason="edt stamper on egress", **kw))
    td.ops.extend(mapcls.diff(dp.device, dp.ifindex, dp.map_classifier, st.map_classifier))
    fresh = dict(stamper=dp.stamper, initial_q16=planmod.initial_q16(dp), initial_parents=planmod.initial_parents(dp))
    if st.stamper_name != dp.stamper.name:
        td.ops.append(SetStamper(reason="departure times per tenant", **fresh, **kw))
    elif st.pod_entries is None and dp.pods:
        # Caps to enforce in maps that cannot be read (nor, then, by the rate controller): a fresh stamper,
        # pinned again, with every pod's entry written before it is attached.
        td.ops.append(SetStamper(reason=f"its maps cannot be read ({st.maps_error}): replaced with the capped "
                                 "pods' entries", **fresh, **kw))
    elif st.pod_entries is None:
        td.note = f"edt stamper maps on {dp.device} not read ({st.maps_error}): no pod key checked for leftovers"
    else:
        td.ops.extend(diff_pods(dp, st))
    return td


def diff_pods(dp: EdtDevicePlan, st: EdtDeviceState) -> list:
    """The capped pods' entries in the attached stamper's maps: each wanted key's parent and rate where they
    differ (only what differs), and every other key with a parent cleared (a pod gone or uncapped). The
    parent is the marker: a key with one is a pod key (kernel_stamper.py writes it first, clears it last)."""
    kw = dict(device=dp.device, ifindex=dp.ifindex, prog_id=st.stamper_prog_id)
    have = st.pod_entries or {}
    ops: list = []
    for p in dp.pods:
        got = have.get(p.key)  # None: no parent there, and so (written after it) no rate of ours either
        if got == (p.parent, p.ns_per_byte_q16):
            continue
        ops.append(SetPodKey(key=p.key, parent=None if got and got[0] == p.parent else p.parent,
                             ns_per_byte_q16=None if got and got[1] == p.ns_per_byte_q16 else p.ns_per_byte_q16,
                             pod=p.ref, reason=f"egress cap {format_rate(p.rate_bps)} of pod {p.ref} "
                                               f"(tenant {p.tenant or '(none)'})", **kw))
    wanted = {p.key for p in dp.pods}
    ops += [ClearPodKey(key=k, reason="no capped pod has this key any more", **kw)
            for k in sorted(have) if k not in wanted]
    return ops


def diff_teardown(st: EdtDeviceState, keep_root: bool = False, reason: str = "") -> TargetDiff:
    """Remove what edt owns on a device: its stamper, and its root unless HTB is taking the device over."""
    td = TargetDiff(st.device)
    kw = dict(device=st.device, ifindex=st.ifindex, reason=reason)
    if st.stamper_name is not None:
        td.ops.append(DeleteStamper(prio=PRIO_STAMPER, name=st.stamper_name, **kw))
    if not keep_root:  # a device going back to htb keeps the classifier: HTB wants the same one
        td.ops.extend(mapcls.diff(st.device, st.ifindex, None, st.map_classifier))
    if st.owned and not keep_root:
        td.ops.append(DeleteRoot(handle=ROOT_HANDLE, **kw))
    return td


def stale_stamper_pins(entries: list[str] | None, keep: set[str], reason: str) -> list[TargetDiff]:
    """Unpin every stamper pin entry (device name, or a temporary entry a crash left) not in ``keep``.

    ``entries`` None (no pins in use, or unreadable this time): nothing is collected."""
    return [TargetDiff(f"{name} (edt stamper bpffs pins)", ops=[UnpinStamper(device=name, ifindex=0, reason=reason)])
            for name in entries or () if name not in keep]
