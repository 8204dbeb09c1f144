"""A device's tc state as read back through netlink, normalised for comparison between devices and runs.

"Matches a fresh apply" in the fault, kill and churn tests means: this
snapshot of the device equals the snapshot of a device that got one clean
apply of the same config. Counters, ifindexes and kernel-picked u32 node
handles are left out (they differ between equal trees); everything
shaperd sets in tc is in. Where a bpf filter is the eBPF map classifier, its
map entries are read too (adopted by the filter's program id, as the agent
does), so the eBPF path's whole state is compared as well; program ids differ
between equal trees and are left out.
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
    maps = []
    for parent in sorted({q[0] for q in qdiscs} | {0xFFFFFFF2, 0xFFFFFFF3}):
        try:
            rows = reader.filters(ifindex, parent, device)
        except Exception:  # noqa: BLE001 - no such parent (no clsact): no filters there
            continue
        filters += [(f.parent, f.prio, f.protocol, f.kind, f.classid, f.keys) for f in rows
                    if f.classid or f.keys or f.kind == "bpf"]
        maps += [_classifier_entries(f.prog_id) for f in rows if f.kind == "bpf" and f.prog_id]
    return {"qdiscs": qdiscs, "classes": classes, "filters": sorted(filters, key=repr),
            "filter_count": len(filters), "maps": sorted(m for m in maps if m is not None)}


def _classifier_entries(prog_id: int):
    """The map classifier's entries behind program ``prog_id``, as sorted tuples; None for another program."""
    from shaperd.backends.common.kernel_classifier import ClassifierMaps

    try:
        with ClassifierMaps.adopt(prog_id) as maps:
            return tuple(sorted((role, tuple(sorted(entries.items()))) for role, entries in maps.read().items()))
    except Exception:  # noqa: BLE001 - not the classifier (mark program, edt stamper) or gone meanwhile
        return None
