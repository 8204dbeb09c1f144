"""The tenant-ingress backend's diff, pure: desired IFBs against what was found -> typed operations, in order.

An in-sync uplink yields no operation, so a resync of a healthy node sends no write. Ownership (see
objects.py) is decided here: a device with the IFB's name that is not an IFB, or a classic ``ingress``
qdisc on the uplink, blocks the uplink (left alone, said); shaperd's IFBs and redirects that nothing
wants any more are removed.

Order, per uplink: the IFB (created, or set up: mirred drops what it redirects to a device that is
down), its root, classes (parents first), leaves, the classifier (u32 filters or the map classifier's
entries), then on the uplink a clsact where there is none and the redirect last, so packets are handed
to the IFB only once its tree can take them. Removal is the other way round: the redirect first (an
uplink redirecting to a deleted IFB drops every packet it receives), then the IFB.
"""

from __future__ import annotations

from shaperd.backends.common import mapcls
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.common.objects import ETH_P_ALL, fmt_handle
from shaperd.backends.ingress.objects import (
    INGRESS_ROOT, TCA_EGRESS_REDIR, IfbPlan, IfbState, IngressObserved, IngressPlan, UplinkState,
)
from shaperd.backends.ingress.ops import (
    AddDstFilter, AddRedirect, ChangeClass, ChangeRoot, CreateClass, CreateIfb, CreateRoot, DeleteClass,
    DeleteFilter, DeleteIfb, DeleteRedirect, DeleteRoot, SetIfbUp, SetLeaf,
)
from shaperd.core.ids import ifb_name
from shaperd.core.protocol import Operation, TargetDiff

_FIELD_NAMES = ("parent", "rate", "ceil", "burst", "cburst", "quantum", "prio")
MATCH_ALL = ((0, 0, 0),)  # u32 "match u32 0 0": one key, value 0, mask 0, offset 0


def redirect_in_sync(up: UplinkState | None, ifb_ifindex: int) -> bool:
    """The uplink carries exactly shaperd's redirect, to this IFB."""
    if up is None or len(up.redirects) != 1:
        return False
    r = up.redirects[0]
    return r.protocol == ETH_P_ALL and tuple(r.keys) == MATCH_ALL and r.mirred == (TCA_EGRESS_REDIR, ifb_ifindex)


def blocked_reason(dp: IfbPlan, observed: IngressObserved) -> str | None:
    """Why this uplink's inbound shaping is left alone (something that is not shaperd's is in the way)."""
    kind = observed.squatters.get(dp.ifb)
    if kind is not None:
        return (f"device {dp.ifb} exists and is {kind or 'a device'} of another kind, not shaperd's IFB; left alone "
                f"(inbound traffic on {dp.uplink} is not shaped)")
    up = observed.uplinks.get(dp.uplink)
    if up is not None and up.ingress_qdisc:
        return (f"{dp.uplink} has an ingress qdisc that is not shaperd's (a clsact cannot be added beside it); "
                "left alone (inbound traffic is not shaped)")
    return None


def diff_uplink(dp: IfbPlan, observed: IngressObserved) -> TargetDiff:
    out = TargetDiff(dp.ifb)
    why = blocked_reason(dp, observed)
    if why:
        out.blocked = why
        return out
    st = observed.ifbs.get(dp.ifb)
    tenant_of = {c.classid: c.tenant for c in dp.classes}
    if st is None:
        out.ops.append(CreateIfb(device=dp.ifb, ifindex=0, uplink=dp.uplink, reason="missing"))
        st = IfbState(dp.ifb, 0, up=True)
    elif not st.up:
        out.ops.append(SetIfbUp(device=dp.ifb, ifindex=st.ifindex, reason="it is down"))
    out.ops.extend(_tree(dp, st, tenant_of))
    up = observed.uplinks.get(dp.uplink)
    if not redirect_in_sync(up, st.ifindex) or st.ifindex == 0:
        kw = dict(device=dp.uplink, ifindex=dp.uplink_ifindex)
        if up is not None and up.redirects:
            was = "; ".join(r.describe() for r in up.redirects)
            out.ops.append(DeleteRedirect(reason=f"not the redirect to {dp.ifb}: {was}", **kw))
        if up is None or not up.clsact:
            out.ops.append(AddClsact(reason="missing", **kw))
        out.ops.append(AddRedirect(ifb=dp.ifb, ifb_ifindex=st.ifindex, reason="missing", **kw))
    return out


def _tree(dp: IfbPlan, st: IfbState, tenant_of: dict) -> list[Operation]:
    dev, idx = dp.ifb, st.ifindex
    if not st.owned_root or any(st.classes.get(c.classid) is not None and st.classes[c.classid].parent != c.parent
                                for c in dp.classes):
        ops: list[Operation] = []
        reason = "missing" if st.root is None else (f"replacing root qdisc {st.root.kind} {fmt_handle(st.root.handle)}"
                                                    if not st.owned_root else "class tree structure differs")
        if st.owned_root:  # an htb replacing an htb of the same handle would be a change: remove it first
            ops.append(DeleteRoot(device=dev, ifindex=idx, handle=INGRESS_ROOT, reason=reason))
        ops.append(CreateRoot(device=dev, ifindex=idx, root=dp.root, reason=reason))
        ops.extend(CreateClass(device=dev, ifindex=idx, cls=c, reason="missing", tenant=c.tenant) for c in dp.classes)
        ops.extend(SetLeaf(device=dev, ifindex=idx, leaf=q, reason="missing", tenant=tenant_of.get(q.parent))
                   for q in dp.leaves)
        ops.extend(AddDstFilter(device=dev, ifindex=idx, filter=f, reason="missing", tenant=tenant_of.get(f.classid))
                   for f in dp.filters)
        ops.extend(mapcls.diff(dev, idx, dp.map_classifier, st.map_classifier))
        return ops
    ops, kept = _stale_filters(dp, st)
    wanted_ids = {c.classid for c in dp.classes}
    ops.extend(DeleteClass(device=dev, ifindex=idx, classid=cid, reason="stale")
               for cid in sorted(st.classes, reverse=True) if cid not in wanted_ids)
    if st.root.default_minor != dp.root.default_minor:
        ops.append(ChangeRoot(device=dev, ifindex=idx, root=dp.root, reason=f"default class {st.root.default_minor:x}"))
    for c in dp.classes:
        have = st.classes.get(c.classid)
        if have is None:
            ops.append(CreateClass(device=dev, ifindex=idx, cls=c, reason="missing", tenant=c.tenant))
        elif have.kernel_fields() != c.kernel_fields():
            delta = ", ".join(f"{n} {a}->{b}" for n, a, b in zip(_FIELD_NAMES, have.kernel_fields(), c.kernel_fields())
                              if a != b)
            ops.append(ChangeClass(device=dev, ifindex=idx, cls=c, reason=f"differs: {delta}", tenant=c.tenant))
    for q in dp.leaves:
        have_q = st.leaves.get(q.parent)
        if have_q != q:
            why = "missing" if have_q is None else f"was {have_q.kind} {fmt_handle(have_q.handle)} limit {have_q.limit}"
            ops.append(SetLeaf(device=dev, ifindex=idx, leaf=q, reason=why, tenant=tenant_of.get(q.parent)))
    ops.extend(AddDstFilter(device=dev, ifindex=idx, filter=f, reason="missing", tenant=tenant_of.get(f.classid))
               for f in dp.filters if _ident(f) not in kept)
    ops.extend(mapcls.diff(dev, idx, dp.map_classifier, st.map_classifier))
    return ops


def _ident(f) -> tuple:
    return (f.prio, f.protocol, f.classid, tuple(f.keys))


def _stale_filters(dp: IfbPlan, st: IfbState) -> tuple[list[Operation], set]:
    """Deletes of the filters on the IFB's root the plan lacks (duplicates included), and those kept."""
    want = {_ident(f) for f in dp.filters}
    kept: set = set()
    ops: list[Operation] = []
    for f in sorted(st.filters, key=lambda f: (f.prio, f.protocol, f.handle)):
        key = _ident(f)
        if f.kind == "u32" and f.mark is None and key in want and key not in kept:
            kept.add(key)
        else:
            ops.append(DeleteFilter(device=dp.ifb, ifindex=st.ifindex, filter=f, reason="stale"))
    return ops, kept


def diff(desired: IngressPlan, observed: IngressObserved) -> list[TargetDiff]:
    """Every planned uplink's diff, then the removal of shaperd's IFBs and redirects nothing wants (those of
    uplinks that failed to plan are kept), then the bpffs pins of IFBs without a map classifier."""
    out = [diff_uplink(dp, observed) for dp in desired.devices]
    keep_ifbs = {dp.ifb for dp in desired.devices} | {ifb_name(u) for u in desired.skipped}
    keep_uplinks = {dp.uplink for dp in desired.devices} | set(desired.skipped)
    out.extend(removals(observed, keep_ifbs, keep_uplinks, "no tenant ingress planned on its uplink"))
    keep_pins = {dp.ifb for dp in desired.devices if dp.map_classifier is not None} | keep_ifbs - {
        dp.ifb for dp in desired.devices}
    out.extend(mapcls.stale_pins(observed.pin_entries, keep_pins, "no IFB with the eBPF map classifier by that name"))
    return out


def removals(observed: IngressObserved, keep_ifbs: set[str], keep_uplinks: set[str], reason: str) -> list[TargetDiff]:
    """Per IFB of shaperd's not kept: its uplink's redirect, then the IFB; per other uplink with shaperd's
    redirect (its IFB gone): the redirect."""
    out: list[TargetDiff] = []
    done: set[str] = set()
    by_ifb = {ifb_name(name): up for name, up in observed.uplinks.items()}
    for name, st in sorted(observed.ifbs.items()):
        if name in keep_ifbs:
            continue
        td = TargetDiff(name)
        up = by_ifb.get(name)
        if up is not None and up.redirects and up.name not in keep_uplinks:
            td.ops.append(DeleteRedirect(device=up.name, ifindex=up.ifindex, reason=reason))
            done.add(up.name)
        td.ops.append(DeleteIfb(device=name, ifindex=st.ifindex, reason=reason))
        out.append(td)
    for name, up in sorted(observed.uplinks.items()):
        if up.redirects and name not in keep_uplinks and name not in done:
            out.append(TargetDiff(name, ops=[DeleteRedirect(device=name, ifindex=up.ifindex, reason=reason)]))
    return out


def teardown(observed: IngressObserved) -> list[TargetDiff]:
    """Nothing desired: every redirect and IFB of shaperd's removed, the pins unpinned; the uplinks and IFBs
    that could not be read fail it; others' IFBs are said and left alone."""
    out = removals(observed, set(), set(), "teardown")
    out += mapcls.stale_pins(observed.pin_entries, set(), "teardown")
    out += [TargetDiff(dev, error=err) for dev, err in sorted(observed.errors.items())]
    if observed.pin_error is not None:
        out.append(TargetDiff("ingress bpffs pins", error=observed.pin_error))
    out += [TargetDiff(name, note=f"ifb device {name} is not shaperd's: left alone") for name in observed.foreign_ifbs]
    out += [TargetDiff(name, note=f"device {name} has the name of shaperd's IFB but is {kind or 'of another kind'}: "
                                  "left alone") for name, kind in sorted(observed.squatters.items())]
    return out
