"""Probe, once at start, what this kernel's traffic control offers.

Runs in a throwaway network namespace so nothing on the node's own devices
is touched: creates a veth pair there and tries each qdisc and classifier
shaperd may use. The result decides between degrading with a warning and
failing with a message naming the missing feature.
"""

from __future__ import annotations

import os

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from ..inventory import Capabilities
from . import netns as netns_mod
from . import tc as _tc  # noqa: F401 - registers the bfifo codec with pyroute2


def default_qdisc(procfs_root: str = "/proc") -> str | None:
    """net.core.default_qdisc: the kernel instantiates it on every new device, so it is built in or loadable."""
    try:
        with open(os.path.join(procfs_root, "sys", "net", "core", "default_qdisc")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _classifier_notes(how: str, why: str, notes: list[str]) -> tuple[bool, str]:
    """(bpf_maps, bpf_adopt) from probe_load's answer, honouring SHAPERD_CLASSIFIER=u32; notes say why."""
    if os.environ.get("SHAPERD_CLASSIFIER", "") == "u32" and how:
        notes.append("classifier: u32 path (SHAPERD_CLASSIFIER=u32)")
        return False, ""
    if not how:
        notes.append(f"eBPF map classifier unavailable ({why}): classifying with u32 filters")
        return False, ""
    notes.append(f"eBPF map classifier adopted after a restart {'through ' if how == 'pins' else ''}{why}")
    return True, how


def probe_capabilities(procfs_root: str = "/proc", bpffs_root: str | None = None) -> Capabilities:
    """``bpffs_root``: where the map classifier's pins go (None: by-id adoption only; the CLI passes
    --bpffs-root, default /sys/fs/bpf)."""
    name = f"shaperd-probe-{os.getpid()}"
    notes: list[str] = []
    try:
        netns.create(name)
    except OSError as e:
        # No CAP_SYS_ADMIN (the DaemonSet and the systemd unit drop it), or no netns support:
        # assume the common kernel set, say so. Loading a do-nothing SCHED_CLS program touches
        # no device, so cls_bpf is still tested here rather than assumed missing.
        from . import bpf, bpf_classify

        bpf_ok, why = bpf.bpf_supported()
        # The map classifier: its maps made, its program loaded and got back, not attached (no probe device).
        how, maps_why = bpf_classify.probe_load(bpffs_root) if bpf_ok else ("", "cls_bpf unavailable")
        # fq_codel leaves when the node's default qdisc is fq_codel (systemd's default): it exists there.
        leaf = {"bfifo"} | ({"fq_codel"} if default_qdisc(procfs_root) == "fq_codel" else set())
        notes = [f"capability probe skipped ({e.strerror or e}); assuming htb, u32, {', '.join(sorted(leaf))}"]
        if not bpf_ok:
            notes.append(f"cls_bpf unavailable ({why}): match.interfaces cannot be enforced")
        maps_ok, adopt = _classifier_notes(how, maps_why, notes)
        return Capabilities(htb=True, u32=True, bpf=bpf_ok, bpf_maps=maps_ok, bpf_adopt=adopt,
                            bpf_pin_root=bpffs_root if adopt == "pins" else "", leaf_kinds=frozenset(leaf),
                            notes=tuple(notes))
    try:
        with netns_mod.entered(name):
            ipr = IPRoute()  # a socket keeps the namespace it was made in
        with ipr:
            ipr.link("add", ifname="p0", kind="veth", peer="p1")
            idx = ipr.link_lookup(ifname="p0")[0]
            ipr.link("set", index=idx, state="up")
            htb = _try(lambda: ipr.tc("replace", "htb", idx, 0x10000, default=0x2))
            if not htb:
                notes.append("sch_htb missing: shaperd cannot enforce anything on this kernel")
                return Capabilities(htb=False, u32=False, bpf=False, leaf_kinds=frozenset(), notes=tuple(notes))
            ipr.tc("add-class", "htb", idx, 0x10002, parent=0x10000, rate="1mbit")
            leaf = set()
            for kind, kw in (("fq_codel", {}), ("bfifo", {"limit": 100000})):
                if _try(lambda: ipr.tc("replace", kind, idx, 0x20000, parent=0x10002, **kw)):
                    leaf.add(kind)
            u32 = _try(lambda: ipr.tc("add-filter", "u32", idx, parent=0x10000, prio=1, protocol=0x0800,
                                      target=0x10002, keys=["0xc6120000/0xffff0000+12"]))
            from . import bpf, bpf_classify

            bpf_ok, why = bpf.bpf_supported()
            attach_ok, maps_why = bpf_classify.probe(ipr, idx) if bpf_ok else (False, "cls_bpf unavailable")
        # Attaching works: now how a restarted agent gets the maps back (pins first, else by id).
        how, adopt_why = bpf_classify.probe_load(bpffs_root) if attach_ok else ("", maps_why)
        if not bpf_ok:
            notes.append(f"cls_bpf unavailable ({why}): match.interfaces cannot be enforced")
        maps_ok, adopt = _classifier_notes(how, adopt_why, notes)
        if "fq_codel" not in leaf:
            notes.append("fq_codel missing: leaf queues are bfifo sized in time at the class ceiling")
        return Capabilities(htb=True, u32=u32, bpf=bpf_ok, bpf_maps=maps_ok, bpf_adopt=adopt,
                            bpf_pin_root=bpffs_root if adopt == "pins" else "", leaf_kinds=frozenset(leaf),
                            notes=tuple(notes))
    finally:
        try:
            netns.remove(name)
        except OSError:
            pass


def _try(fn) -> bool:
    try:
        fn()
        return True
    except (NetlinkError, OSError):
        return False
