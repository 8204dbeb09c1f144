"""`shaperd status`: which classifier path each shaped device uses, read back from the kernel.

A device carrying shaperd's HTB root uses the eBPF path when shaperd's map
classifier filter is on its clsact egress hook, else the u32 path. Reads
only (through the rtnetlink reader); never writes.
"""

from __future__ import annotations

from shaperd.backends.common import mapcls
from shaperd.backends.htb.observe import owned_ifindexes
from shaperd.backends.common.kernel_classifier import TC_H_CLSACT_EGRESS


def collect(reader, device_probe=None) -> dict[str, dict]:
    """{device: {"path": "ebpf"|"u32", "program": name, "prog_id": id, "htb_offload": "on"|"off"}} for every
    device shaperd shapes; with ``device_probe`` (discovery/htb_offload.DeviceProbe), why offload is off."""
    qdiscs = reader.qdiscs()
    links = reader.links()
    names = {l.ifindex: l.name for l in links}
    clsact = {q.ifindex for q in qdiscs if q.kind == "clsact"}
    out = {}
    for idx in sorted(owned_ifindexes(qdiscs)):
        dev = names.get(idx, str(idx))
        row = {"path": "u32", "program": None, "prog_id": None}
        if idx in clsact:
            for f in reader.filters(idx, TC_H_CLSACT_EGRESS, dev):
                if f.kind == "bpf" and f.prio == mapcls.PRIO_EGRESS_CLASSIFY and mapcls.is_ours(f.name):
                    row = {"path": "ebpf", "program": f.name, "prog_id": f.prog_id}
        root = next((q for q in qdiscs if q.ifindex == idx and q.parent == 0xFFFFFFFF), None)
        row["htb_offload"] = "on" if root is not None and root.offload else "off"
        out[dev] = row
    if device_probe is not None:
        with_offload_reasons(out, links, device_probe)
    return out


def with_offload_reasons(paths: dict[str, dict], links, device_probe, refused: dict | None = None) -> dict[str, dict]:
    """Add "htb_offload_why" where offload is off: the kernel's refusal where the applying process recorded
    one (``refused``: device -> {"reason"}, report/edt_refused.py's "htb" part), else the device probe's
    (discovery/htb_offload.py) reason."""
    refused = refused or {}
    by_name = {l.name: l for l in links}
    off = [by_name[dev] for dev, r in paths.items() if r.get("htb_offload") == "off" and dev in by_name]
    found = device_probe.probe(off) if off else {}
    for dev, probe in found.items():
        if dev in refused:
            paths[dev]["htb_offload_why"] = f"the kernel refused htb offload: {refused[dev].get('reason', '')}"
            continue
        paths[dev]["htb_offload_why"] = (probe.why if not probe.capable else
                                         "the device can offload; the plan keeps it in software "
                                         "(the daemon's warnings say why)")
    return paths


def render(paths: dict[str, dict]) -> str:
    lines = ["Classifier:"]
    for dev, r in sorted(paths.items()):
        extra = f" (program {r['program']}, id {r['prog_id']})" if r["path"] == "ebpf" else ""
        lines.append(f"  {dev}: {r['path']}{extra}")
        if "htb_offload" in r:
            why = f" ({r['htb_offload_why']})" if r.get("htb_offload_why") else ""
            lines.append(f"  {dev}: htb offload: {r['htb_offload']}{why}")
    return "\n".join(lines)
