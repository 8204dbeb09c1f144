"""The edt backend's pure diff: desired mq/fq/stamper vs what the kernel holds -> typed operations.

Ownership: the root is edt's when it is 7365: (mq or fq). A kernel default
root (noqueue, pfifo_fast, an unnamed mq, fq_codel, fq, pfifo) and shaperd's
own HTB tree (7368:, when a device moves from htb to edt) are replaced; any
other root belongs to someone else and blocks the device unless take_over.
clsact is shared (the map classifier and other agents use it): added if
missing, never deleted. Only the stamper's own filter (its prio) is edt's.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.backends.common.objects import DEFAULT_ROOT_KINDS, ROOT_HANDLE as HTB_ROOT_HANDLE
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.common import mapcls
from shaperd.backends.edt import plan as planmod
from shaperd.backends.edt.objects import PRIO_STAMPER, ROOT_HANDLE, EdtDevicePlan, EdtDeviceState
from shaperd.backends.edt.ops import DeleteRoot, DeleteStamper, SetFq, SetRoot, SetStamper, UnpinStamper


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
    if st.stamper_name != dp.stamper.name:
        td.ops.append(SetStamper(stamper=dp.stamper, initial_q16=planmod.initial_q16(dp),
                                 reason="departure times per tenant", **kw))
    return td


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
