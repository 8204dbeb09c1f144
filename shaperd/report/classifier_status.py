"""`shaperd status`: which classifier path each shaped device uses, read back from the kernel.

A device carrying shaperd's HTB root uses the eBPF path when shaperd's map
classifier filter is on its clsact egress hook, else the u32 path. Reads
only (through the rtnetlink reader); never writes.
"""

from __future__ import annotations

from ..backends.htb import mapcls
from ..backends.htb.observe import owned_ifindexes
from ..kernel.bpf_classify import TC_H_CLSACT_EGRESS


def collect(reader) -> dict[str, dict]:
    """{device: {"path": "ebpf"|"u32", "program": name, "prog_id": id}} for every device shaperd shapes."""
    qdiscs = reader.qdiscs()
    names = {l.ifindex: l.name for l in reader.links()}
    clsact = {q.ifindex for q in qdiscs if q.kind == "clsact"}
    out = {}
    for idx in sorted(owned_ifindexes(qdiscs)):
        dev = names.get(idx, str(idx))
        row = {"path": "u32", "program": None, "prog_id": None}
        if idx in clsact:
            for f in reader.filters(idx, TC_H_CLSACT_EGRESS, dev):
                if f.kind == "bpf" and f.prio == mapcls.PRIO_EGRESS_CLASSIFY and mapcls.is_ours(f.name):
                    row = {"path": "ebpf", "program": f.name, "prog_id": f.prog_id}
        out[dev] = row
    return out


def render(paths: dict[str, dict]) -> str:
    lines = ["Classifier:"]
    for dev, r in sorted(paths.items()):
        extra = f" (program {r['program']}, id {r['prog_id']})" if r["path"] == "ebpf" else ""
        lines.append(f"  {dev}: {r['path']}{extra}")
    return "\n".join(lines)
