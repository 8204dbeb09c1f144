"""Read the HTB backend's state from the kernel: rtnetlink rows into DeviceState, and class counters.

Turns the reader's typed rows (kernel/rtnl_rows.py) into the backend's own
objects, keeping only what is shaperd's (handle major 7368). The reads go
through the kernel side's reader; no netlink is spoken here.
"""

from __future__ import annotations

from shaperd.kernel.rtnl_rows import TC_H_ROOT, FilterRow, HtbClassRow, QdiscRow
from shaperd.backends.common.objects import (
    HANDLE_MAJOR,
    PRIO_CHAIN_FIRST,
    ROOT_CLASS_MINOR,
    ROOT_HANDLE,
    DeviceState,
    LeafQdisc,
    ObservedClass,
    ObservedFilter,
    RootQdisc,
)


def owned_ifindexes(qdiscs: list[QdiscRow]) -> set[int]:
    """Devices whose root qdisc is shaperd's."""
    return {q.ifindex for q in qdiscs if q.parent == TC_H_ROOT and q.handle == ROOT_HANDLE and q.kind == "htb"}


def observed_filter(f: FilterRow) -> ObservedFilter:
    # Key rows compare equal to U32Key: no copy.
    return ObservedFilter(f.kind, f.prio, f.protocol, f.handle, f.parent, f.classid, f.keys, f.name, f.mark)


def device_state(reads, device: str, ifindex: int, qdiscs: list[QdiscRow] | None = None) -> DeviceState:
    """Root qdisc, shaperd's classes, leaves and filters on one device (three dumps at most)."""
    st = DeviceState(device=device, ifindex=ifindex, root=None)
    for q in (qdiscs if qdiscs is not None else reads.qdiscs(ifindex, device)):
        if q.ifindex != ifindex:
            continue
        if q.parent == TC_H_ROOT:
            st.root = RootQdisc(kind=q.kind, handle=q.handle, default_minor=q.default_minor, offload=q.offload)
        elif q.parent >> 16 == HANDLE_MAJOR:
            st.leaves[q.parent] = LeafQdisc(parent=q.parent, handle=q.handle, kind=q.kind, limit=q.limit)
    if not st.owned:
        return st  # nothing under a foreign or default root is ours to read
    for c in reads.htb_classes(ifindex, device):
        if c.classid >> 16 != HANDLE_MAJOR:
            continue
        # A top-level class reports TC_H_ROOT as parent; shaperd creates it under the qdisc handle.
        st.classes[c.classid] = ObservedClass(
            classid=c.classid, parent=ROOT_HANDLE if c.parent == TC_H_ROOT else c.parent, rate_Bps=c.rate_Bps,
            ceil_Bps=c.ceil_Bps, buffer_ticks=c.buffer_ticks, cbuffer_ticks=c.cbuffer_ticks,
            quantum_bytes=c.quantum_bytes, prio=c.prio, leaf_handle=c.leaf_handle,
        )
    st.filters = [observed_filter(f) for f in reads.filters(ifindex, ROOT_HANDLE, device)]
    root_cls = ROOT_HANDLE | ROOT_CLASS_MINOR
    inner = sorted(p for p in {c.parent for c in st.classes.values()} - {ROOT_HANDLE, root_cls} if p in st.classes)
    if inner:
        st.filters = _with_class_chains(st, inner, [observed_filter(f) for p in inner
                                                    for f in reads.filters(ifindex, p, device)])
    return st


def _with_class_chains(st: DeviceState, inner: list[int], chain_rows: list[ObservedFilter]) -> list[ObservedFilter]:
    """Root and inner-class (destination scope) filters, each once, each with the chain it sits in.

    u32 keeps one hash-table list per qdisc and its dump walks every table of
    the dumped prio, whichever chain created it, so one u32 node can appear in
    several chains' dumps. Node handles are unique per qdisc: keep each node
    once, in the chain of the class whose child it targets where its prio is
    an inner chain's (PRIO_CHAIN_FIRST and above: shaperd puts a filter in an
    inner class's chain only towards that class's own leaves), else in the
    root's (a root filter may send a capped pod straight to its leaf under an
    inner tenant class: backends/htb/pods.py).
    """
    out: dict[tuple, ObservedFilter] = {}
    for f in st.filters + chain_rows:
        key = (f.kind, f.prio, f.protocol, f.handle)
        if f.kind != "u32":
            out.setdefault(key + (f.parent,), f)
            continue
        target = st.classes.get(f.classid)
        in_chain = f.prio >= PRIO_CHAIN_FIRST and target is not None and target.parent in inner
        parent = target.parent if in_chain else ROOT_HANDLE
        out[key] = f._replace(parent=parent)
    return list(out.values())


def read_counters(reader) -> dict[tuple[str, int], HtbClassRow]:
    """{(device, classid): class row with counters} for every shaperd class on every shaped device."""
    names = {l.ifindex: l.name for l in reader.links()}
    out = {}
    for idx in sorted(owned_ifindexes(reader.root_qdiscs())):
        dev = names.get(idx, str(idx))
        rows = {c.classid: c for c in reader.htb_classes(idx, dev) if c.classid >> 16 == HANDLE_MAJOR}
        for cid, c in with_leaf_queues(rows).items():
            out[(dev, cid)] = c
    return out


def with_leaf_queues(rows: dict[int, HtbClassRow]) -> dict[int, HtbClassRow]:
    """Inner tenant classes (destination scopes) with their leaves' drops and queue folded in.

    HTB counts bytes at every level but drops and backlog only where the queue
    is, in the leaves; a scoped tenant's own class would otherwise report 0
    drops. The root class is left as the kernel reports it.
    """
    root_cls = ROOT_HANDLE | ROOT_CLASS_MINOR
    extra: dict[int, list[int]] = {}
    for c in rows.values():
        if c.parent in rows and c.parent != root_cls:
            e = extra.setdefault(c.parent, [0, 0, 0])
            e[0] += c.drops
            e[1] += c.backlog_bytes
            e[2] += c.qlen
    out = dict(rows)
    for cid, (drops, backlog, qlen) in extra.items():
        p = rows[cid]
        out[cid] = p._replace(drops=p.drops + drops, backlog_bytes=p.backlog_bytes + backlog, qlen=p.qlen + qlen)
    return out
