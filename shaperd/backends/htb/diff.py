"""Diff desired against observed HTB state: the typed writes that close the gap.

Owns the ownership rules and the order of operations. An in-sync device
yields no operation at all, so a resync of a healthy node sends no write.
Pure: no I/O; the kernel side executes the operations.

Ownership, in one place:
- the root qdisc with handle 7368: of kind htb is shaperd's, and so is
  everything under it (classes, leaf queues, filters): stale objects there
  are removed;
- a kernel default root qdisc (noqueue, pfifo_fast, mq, fq_codel, fq, pfifo)
  may be replaced;
- any other root qdisc belongs to someone else and is left alone and
  reported, unless the operator asked to take over;
- shaperd never touches ingress/clsact qdiscs here (the marks backend owns
  only its own filter there) or other devices' state.
"""

from __future__ import annotations

from shaperd.core.protocol import Operation, TargetDiff
from shaperd.backends.common import mapcls
from shaperd.backends.common.objects import (
    DEFAULT_ROOT_KINDS,
    ETH_P_ALL,
    ROOT_HANDLE,
    BpfFilter,
    DevicePlan,
    DeviceState,
    Filter,
    HtbClass,
    RootQdisc,
    U32Filter,
    fmt_handle,
)
from shaperd.backends.htb.ops import (
    AddBpfFilter,
    AddU32Filter,
    ChangeClass,
    ChangeRoot,
    CreateClass,
    CreateRoot,
    DeleteClass,
    DeleteFilter,
    DeleteFilterGroup,
    DeleteRoot,
    SetLeaf,
)

_FIELD_NAMES = ("parent", "rate", "ceil", "burst", "cburst", "quantum", "prio")


def root_verdict(observed: DeviceState, take_over: bool) -> tuple[str, str]:
    """('adopt'|'replace'|'foreign', reason) for the device's root qdisc."""
    root = observed.root
    if observed.owned:
        return "adopt", ""
    if root is None or root.kind in DEFAULT_ROOT_KINDS:
        kind = root.kind if root else "none"
        return "replace", f"replacing default root qdisc {kind}"
    what = f"root qdisc {root.kind} {fmt_handle(root.handle)}"
    if take_over:
        return "replace", f"taking over {what} (take-over requested)"
    return "foreign", f"{what} is not shaperd's; left alone (set node.takeOver or pass --take-over to replace it)"


def diff_device(desired: DevicePlan, observed: DeviceState, take_over: bool = False) -> TargetDiff:
    """The operations that make ``observed`` the ``desired`` tree: none when in sync, a rebuild when the
    root cannot be kept, a blocked diff (no operation) when the root qdisc is someone else's."""
    out = TargetDiff(desired.device)
    verdict, reason = root_verdict(observed, take_over)
    if verdict == "foreign":
        out.blocked = reason
        return out
    tenant_of = {c.classid: c.tenant for c in desired.classes}
    kept_root = observed.root if verdict == "adopt" else None  # "adopt" means shaperd's own root is there
    if kept_root is not None:
        rebuild = _rebuild_reason(desired, observed, kept_root)
        if rebuild:
            kept_root, reason = None, rebuild
    if kept_root is None:
        out.ops.extend(_rebuilt(desired, observed, reason, tenant_of))
    else:
        out.ops.extend(_updated(desired, observed, kept_root, tenant_of))
    return out


def _rebuild_reason(desired: DevicePlan, observed: DeviceState, root: RootQdisc) -> str:
    """Why shaperd's own tree cannot be changed in place ("" when it can)."""
    if _needs_rebuild(desired, observed):
        return "class tree structure differs; rebuilding"
    if root.offload != desired.root.offload:
        # The kernel fixes offload at htb_init: switching means a new root (the tree is rebuilt, traffic
        # is unshaped for the few writes in between).
        return ("htb offload: replacing the software root with an offloaded one" if desired.root.offload else
                "htb offload off: replacing the offloaded root with a software one")
    return ""


def _rebuilt(desired: DevicePlan, observed: DeviceState, reason: str,
             tenant_of: dict[int, str | None]) -> list[Operation]:
    """A new root and everything under it, after removing shaperd's old root if there is one."""
    dev, idx = desired.device, desired.ifindex
    ops: list[Operation] = []
    if observed.owned:
        # Replacing an htb with an htb of the same handle is a "change" to the kernel: remove first.
        ops.append(DeleteRoot(device=dev, ifindex=idx, reason=reason))
    ops.append(CreateRoot(device=dev, ifindex=idx, root=desired.root, reason=reason))
    ops.extend(CreateClass(device=dev, ifindex=idx, cls=c, reason="missing", tenant=c.tenant)
               for c in desired.classes)
    ops.extend(SetLeaf(device=dev, ifindex=idx, leaf=q, reason="missing", tenant=tenant_of.get(q.parent))
               for q in desired.leaves)
    ops.extend(_add_filter(dev, idx, f, "missing", tenant_of) for f in desired.filters)
    ops.extend(mapcls.diff(dev, idx, desired.map_classifier, observed.map_classifier))
    return ops


def _updated(desired: DevicePlan, observed: DeviceState, root: RootQdisc,
             tenant_of: dict[int, str | None]) -> list[Operation]:
    """The changes to shaperd's kept tree, in an order the kernel accepts: stale filters first (so stale
    classes are free to go), stale classes deepest first, the root, classes parents first, leaves, then
    the missing filters and the map classifier's entries."""
    dev, idx = desired.device, desired.ifindex
    want: dict[object, Filter] = {_ident(f): f for f in desired.filters}
    ops, kept = _stale_filters(desired, observed, want)
    ops.extend(_stale_classes(desired, observed))
    if root.default_minor != desired.root.default_minor:
        ops.append(ChangeRoot(device=dev, ifindex=idx, root=desired.root,
                              reason=f"default class {root.default_minor:x}"))
    ops.extend(_class_changes(desired, observed))
    ops.extend(_leaf_changes(desired, observed, tenant_of))
    ops.extend(_add_filter(dev, idx, f, "missing", tenant_of) for key, f in want.items() if key not in kept)
    # The eBPF map classifier on clsact egress: entry writes only, none when in sync.
    ops.extend(mapcls.diff(dev, idx, desired.map_classifier, observed.map_classifier))
    return ops


def _stale_filters(desired: DevicePlan, observed: DeviceState,
                   want: dict[object, Filter]) -> tuple[list[Operation], set[object]]:
    """Deletes of the filters under shaperd's tree that the plan lacks (whole groups where the plan has
    none of that parent, prio and protocol), and the identities of the filters kept."""
    dev, idx = desired.device, desired.ifindex
    want_groups = {_group(f) for f in desired.filters}
    ops: list[Operation] = []
    kept: set[object] = set()
    stale_groups: set[tuple[int, int, int]] = set()
    for f in sorted(observed.filters, key=lambda f: (f.parent, f.prio, f.protocol, f.handle)):
        if f.parent != ROOT_HANDLE and f.parent not in observed.classes:
            continue  # not a chain under shaperd's tree
        group = (f.parent, f.prio, f.protocol)
        if group not in want_groups:
            stale_groups.add(group)
            continue
        ident = f.identity()
        key = _ident(ident) if ident is not None else None
        if key is not None and key in want and key not in kept:
            kept.add(key)
        else:
            ops.append(DeleteFilter(device=dev, ifindex=idx, filter=f, reason="stale"))
    ops.extend(DeleteFilterGroup(device=dev, ifindex=idx, prio=p, protocol=proto, parent=parent, reason="stale")
               for parent, p, proto in sorted(stale_groups))
    return ops, kept


def _stale_classes(desired: DevicePlan, observed: DeviceState) -> list[Operation]:
    """Deletes of the classes the plan lacks, deepest first."""
    wanted_ids = {c.classid for c in desired.classes}
    stale = [cid for cid in observed.classes if cid not in wanted_ids]
    return [DeleteClass(device=desired.device, ifindex=desired.ifindex, classid=cid, reason="stale")
            for cid in sorted(stale, key=lambda c: -_depth(observed, c))]


def _class_changes(desired: DevicePlan, observed: DeviceState) -> list[Operation]:
    """Creates and changes of the planned classes, in plan order (parents before children)."""
    dev, idx = desired.device, desired.ifindex
    ops: list[Operation] = []
    for c in desired.classes:
        have = observed.classes.get(c.classid)
        if have is None:
            ops.append(CreateClass(device=dev, ifindex=idx, cls=c, reason="missing", tenant=c.tenant))
        elif not _fields_match(have.kernel_fields(), c):
            ops.append(ChangeClass(device=dev, ifindex=idx, cls=c, reason=_class_delta(have.kernel_fields(), c),
                                   tenant=c.tenant))
    return ops


def _leaf_changes(desired: DevicePlan, observed: DeviceState, tenant_of: dict[int, str | None]) -> list[Operation]:
    """The leaf queues that are missing or differ."""
    ops: list[Operation] = []
    for q in desired.leaves:
        have_q = observed.leaves.get(q.parent)
        if have_q != q:
            why = "missing" if have_q is None else f"was {have_q.kind} {fmt_handle(have_q.handle)} limit {have_q.limit}"
            ops.append(SetLeaf(device=desired.device, ifindex=desired.ifindex, leaf=q, reason=why,
                               tenant=tenant_of.get(q.parent)))
    return ops


def diff_teardown(observed: DeviceState, reason: str = "teardown") -> TargetDiff:
    """Remove shaperd's tree from a device (nothing if it carries none)."""
    out = TargetDiff(observed.device)
    if observed.owned:
        out.ops.append(DeleteRoot(device=observed.device, ifindex=observed.ifindex, reason=reason))
    out.ops.extend(mapcls.diff(observed.device, observed.ifindex, None, observed.map_classifier))
    return out


def _add_filter(dev: str, idx: int, f: Filter, reason: str, tenant_of: dict[int, str | None]) -> Operation:
    if isinstance(f, U32Filter):
        return AddU32Filter(device=dev, ifindex=idx, filter=f, reason=reason, tenant=tenant_of.get(f.classid))
    return AddBpfFilter(device=dev, ifindex=idx, filter=f, reason=reason)


def _needs_rebuild(desired: DevicePlan, observed: DeviceState) -> bool:
    # A class whose parent changed cannot be moved in place.
    for c in desired.classes:
        have = observed.classes.get(c.classid)
        if have is not None and have.parent != c.parent:
            return True
    return False


def _ident(f: object) -> object:
    """Identity for matching desired and observed filters (labels excluded)."""
    if isinstance(f, U32Filter):
        return ("u32", f.parent, f.prio, f.protocol, f.classid, f.keys)
    if isinstance(f, BpfFilter):
        return ("bpf", f.prio, f.name)
    return None


def _group(f: Filter) -> tuple[int, int, int]:
    """(chain parent, prio, protocol): one kernel tcf_proto instance."""
    if isinstance(f, U32Filter):
        return (f.parent, f.prio, f.protocol)
    return (ROOT_HANDLE, f.prio, ETH_P_ALL)


def _depth(observed: DeviceState, cid: int) -> int:
    depth, seen = 0, set()
    while cid in observed.classes and cid not in seen:
        seen.add(cid)
        cid = observed.classes[cid].parent
        depth += 1
    return depth


_QUANTUM = _FIELD_NAMES.index("quantum")


def _fields_match(have: tuple, want: HtbClass) -> bool:
    """Equal kernel fields; a planned quantum of 0 (offload: the kernel picks it from the rate) matches any."""
    fields = want.kernel_fields()
    if want.quantum_bytes == 0:
        return have[:_QUANTUM] + have[_QUANTUM + 1:] == fields[:_QUANTUM] + fields[_QUANTUM + 1:]
    return have == fields


def _class_delta(have: tuple, want: HtbClass) -> str:
    diffs = [
        f"{name} {a}->{b}" for name, a, b in zip(_FIELD_NAMES, have, want.kernel_fields()) if a != b
    ]
    return "differs: " + ", ".join(diffs)

