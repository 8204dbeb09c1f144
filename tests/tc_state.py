"""A device's tc state as read back through netlink, normalised for comparison between devices and runs.

"Matches a fresh apply" in the fault, kill and churn tests means: this
snapshot of the device equals the snapshot of a device that got one clean
apply of the same config. Counters, ifindexes and kernel-picked u32 node
handles are left out (they differ between equal trees); everything
shaperd sets in tc is in. The eBPF map classifier's entries (bpf maps) are
not read: tests comparing whole states run the u32 path.
"""

from __future__ import annotations

from shaperd.kernel.rtnl import RtnlReader

COUNTER_FIELDS = ("bytes", "packets", "drops", "overlimits", "backlog_bytes", "qlen", "borrows", "lends",
                  "tokens", "ctokens")


def snapshot(reader: RtnlReader, ifindex: int, device: str) -> dict:
    qdiscs = sorted((q.handle, q.parent, q.kind, q.limit, q.default_minor) for q in reader.qdiscs(ifindex, device))
    classes = sorted(tuple(v for k, v in c._asdict().items() if k not in COUNTER_FIELDS and k != "ifindex")
                     for c in reader.htb_classes(ifindex, device))
    filters = []
    for parent in sorted({q[0] for q in qdiscs} | {0xFFFFFFF2, 0xFFFFFFF3}):
        try:
            rows = reader.filters(ifindex, parent, device)
        except Exception:  # noqa: BLE001 - no such parent (no clsact): no filters there
            continue
        filters += [(f.parent, f.prio, f.protocol, f.kind, f.classid, f.keys) for f in rows
                    if f.classid or f.keys or f.kind == "bpf"]
    return {"qdiscs": qdiscs, "classes": classes, "filters": sorted(filters, key=repr),
            "filter_count": len(filters)}
