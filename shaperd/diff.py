"""Diff desired against observed tc state: the list of writes that closes the gap.

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
- shaperd never touches ingress/clsact qdiscs or other devices' state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .state import (
    DEFAULT_ROOT_KINDS,
    ETH_P_ALL,
    ROOT_HANDLE,
    BpfFilter,
    DevicePlan,
    DeviceState,
    Filter,
    HtbClass,
    ObservedFilter,
    U32Filter,
    fmt_handle,
)

_FIELD_NAMES = ("parent", "rate", "ceil", "burst", "cburst", "quantum", "prio")


@dataclass(frozen=True)
class Op:
    """One write. ``verb`` decides the netlink request; ``obj`` carries its data."""

    verb: str  # replace-root | change-root | delete-root | put-class | delete-class
    #            put-leaf | add-filter | delete-filter | delete-filter-group
    device: str
    ifindex: int
    obj: object = None
    reason: str = ""
    tenant: str | None = None
    create: bool = False  # put-class: a new class (vs. changing an existing one)

    def describe(self) -> str:
        what = {
            "replace-root": lambda: "root qdisc htb 7368:",
            "change-root": lambda: "root qdisc htb 7368:",
            "delete-root": lambda: "root qdisc htb 7368:",
            "put-class": lambda: f"class {fmt_handle(self.obj.classid)}",
            "delete-class": lambda: f"class {fmt_handle(self.obj)}",
            "put-leaf": lambda: f"leaf qdisc {self.obj.kind} {fmt_handle(self.obj.handle)}",
            "add-filter": lambda: _filter_label(self.obj),
            "delete-filter": lambda: _filter_label(self.obj),
            "delete-filter-group": lambda: f"filters at prio {self.obj[0]} protocol 0x{self.obj[1]:04x}",
            "add-clsact": lambda: "clsact qdisc",
            "put-mark": lambda: f"mark program {self.obj.name} (mark 0x{self.obj.value:x}/0x{self.obj.mask:x})",
            "delete-mark": lambda: f"mark program {self.obj.name}",
        }[self.verb]()
        verb = {
            "put-class": "create" if self.create else "change", "put-leaf": "set", "replace-root": "create",
            "change-root": "change", "add-filter": "add", "add-clsact": "add", "put-mark": "set",
        }.get(self.verb, "delete")
        tenant = f" (tenant {self.tenant})" if self.tenant else ""
        reason = f": {self.reason}" if self.reason else ""
        return f"{verb} {what} on {self.device}{tenant}{reason}"


def _filter_label(f: object) -> str:
    if isinstance(f, U32Filter):
        return f"u32 filter {f.prefix or _keys_label(f)} -> {fmt_handle(f.classid)}"
    if isinstance(f, BpfFilter):
        return f"bpf filter {f.name}"
    if isinstance(f, ObservedFilter):
        return f"{f.kind} filter prio {f.prio} handle 0x{f.handle:x}"
    return repr(f)


def _keys_label(f: U32Filter) -> str:
    return " ".join(f"{k.value:08x}/{k.mask:08x}@{k.offset}" for k in f.keys)


@dataclass
class DeviceDiff:
    device: str
    ops: list[Op] = field(default_factory=list)
    # Set when the device is left alone (a foreign root qdisc): why.
    blocked: str | None = None


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


def diff_device(desired: DevicePlan, observed: DeviceState, take_over: bool = False) -> DeviceDiff:
    dev, idx = desired.device, desired.ifindex
    out = DeviceDiff(dev)
    verdict, reason = root_verdict(observed, take_over)
    if verdict == "foreign":
        out.blocked = reason
        return out
    tenant_of = {c.classid: c.tenant for c in desired.classes}
    if verdict == "adopt" and _needs_rebuild(desired, observed):
        verdict, reason = "replace", "class tree structure differs; rebuilding"
    if verdict == "replace":
        if observed.owned:
            # Replacing an htb with an htb of the same handle is a "change" to the kernel: remove first.
            out.ops.append(Op("delete-root", dev, idx, None, reason))
        out.ops.append(Op("replace-root", dev, idx, desired.root, reason))
        out.ops.extend(Op("put-class", dev, idx, c, "missing", c.tenant, create=True) for c in desired.classes)
        out.ops.extend(Op("put-leaf", dev, idx, q, "missing", tenant_of.get(q.parent)) for q in desired.leaves)
        out.ops.extend(Op("add-filter", dev, idx, f, "missing", _filter_tenant(f, tenant_of)) for f in desired.filters)
        return out

    assert observed.root is not None
    # 1. filters: delete stale ones first, so stale classes are free to go.
    want: dict[object, Filter] = {_ident(f): f for f in desired.filters}
    want_groups = {_group(f) for f in desired.filters}
    kept: set[object] = set()
    stale_groups: set[tuple[int, int]] = set()
    for f in sorted(observed.filters, key=lambda f: (f.prio, f.protocol, f.handle)):
        if f.parent != ROOT_HANDLE:
            continue
        group = (f.prio, f.protocol)
        if group not in want_groups:
            stale_groups.add(group)
            continue
        ident = f.identity()
        key = _ident(ident) if ident is not None else None
        if key is not None and key in want and key not in kept:
            kept.add(key)
        else:
            out.ops.append(Op("delete-filter", dev, idx, f, "stale"))
    out.ops.extend(Op("delete-filter-group", dev, idx, g, "stale") for g in sorted(stale_groups))

    # 2. classes that are not in the plan, deepest first.
    wanted_ids = {c.classid for c in desired.classes}
    stale = [cid for cid in observed.classes if cid not in wanted_ids]
    for cid in sorted(stale, key=lambda c: -_depth(observed, c)):
        out.ops.append(Op("delete-class", dev, idx, cid, "stale"))

    # 3. the root qdisc's own parameters.
    if observed.root.default_minor != desired.root.default_minor:
        out.ops.append(Op("change-root", dev, idx, desired.root, f"default class {observed.root.default_minor:x}"))

    # 4. classes in plan order (parents before children).
    for c in desired.classes:
        have = observed.classes.get(c.classid)
        if have is None:
            out.ops.append(Op("put-class", dev, idx, c, "missing", c.tenant, create=True))
        elif have.kernel_fields() != c.kernel_fields():
            out.ops.append(Op("put-class", dev, idx, c, _class_delta(have.kernel_fields(), c), c.tenant))

    # 5. leaf queues.
    for q in desired.leaves:
        have_q = observed.leaves.get(q.parent)
        if have_q != q:
            why = "missing" if have_q is None else f"was {have_q.kind} {fmt_handle(have_q.handle)} limit {have_q.limit}"
            out.ops.append(Op("put-leaf", dev, idx, q, why, tenant_of.get(q.parent)))

    # 6. missing filters.
    for key, f in want.items():
        if key not in kept:
            out.ops.append(Op("add-filter", dev, idx, f, "missing", _filter_tenant(f, tenant_of)))
    return out


def diff_teardown(observed: DeviceState) -> DeviceDiff:
    out = DeviceDiff(observed.device)
    if observed.owned:
        out.ops.append(Op("delete-root", observed.device, observed.ifindex, None, "teardown"))
    return out


def diff_marks(desired, observed: dict[int, ObservedFilter], clsact: set[int], names: dict[int, str]) -> list[Op]:
    """Mark programs on host-side interfaces: set missing/outdated ones, remove ours that are stale.

    shaperd owns only its own filter (prio 0x7368, name shpdm_*) there; the
    clsact qdisc may be shared with other agents and is never removed.
    """
    ops: list[Op] = []
    want = {m.ifindex: m for m in desired}
    for idx, m in sorted(want.items()):
        have = observed.get(idx)
        if have is not None and have.name == m.name:
            continue
        if idx not in clsact:
            ops.append(Op("add-clsact", m.ifname, idx, None, "missing", m.tenant))
        why = "missing" if have is None else f"was {have.name}"
        ops.append(Op("put-mark", m.ifname, idx, m, f"{why}; pods {', '.join(m.pods)}" if m.pods else why, m.tenant))
    for idx, have in sorted(observed.items()):
        if idx not in want:
            ops.append(Op("delete-mark", names.get(idx, str(idx)), idx, have, "stale"))
    return ops


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
        return ("u32", f.prio, f.protocol, f.classid, f.keys)
    if isinstance(f, BpfFilter):
        return ("bpf", f.prio, f.name)
    return None


def _group(f: Filter) -> tuple[int, int]:
    """(prio, protocol): one kernel tcf_proto instance."""
    return (f.prio, f.protocol if isinstance(f, U32Filter) else ETH_P_ALL)


def _filter_tenant(f: Filter, tenant_of: dict[int, str | None]) -> str | None:
    return tenant_of.get(f.classid) if isinstance(f, U32Filter) else None


def _depth(observed: DeviceState, cid: int) -> int:
    depth, seen = 0, set()
    while cid in observed.classes and cid not in seen:
        seen.add(cid)
        cid = observed.classes[cid].parent
        depth += 1
    return depth


def _class_delta(have: tuple, want: HtbClass) -> str:
    diffs = [
        f"{name} {a}->{b}" for name, a, b in zip(_FIELD_NAMES, have, want.kernel_fields()) if a != b
    ]
    return "differs: " + ", ".join(diffs)

