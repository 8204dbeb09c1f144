"""Which data plane enforces each uplink: ``node.dataplane`` (htb | edt | auto) against link and kernel.

The rule (documented in README, "EDT data plane"):

- ``htb``: every uplink gets the HTB tree (the default).
- ``edt``: every uplink gets mq + sch_fq + the stamper, if the kernel has
  sch_fq, mq and cls_bpf and the eBPF map classifier is in use; otherwise HTB, with a warning naming what is missing
  (bad input never costs enforcement).
- a device where applying edt failed because the kernel does not know a
  qdisc kind (backends/edt/refusals.py) is on htb, with a warning, until the
  daemon restarts or the device goes away.
- ``auto``: edt where the kernel has all three AND the uplink's capacity
  (node.capacity, else the reported link speed) is at least
  ``AUTO_EDT_MIN_BPS``; htb everywhere else. Below that rate one HTB lock
  carries the load (on the 2-vCPU test VM every isolation target held at 1 and
  5 Gbit, and failed at 10 Gbit); above it the per-device lock is the limit
  (6.7 Gbit/s software HTB on a 100 Gbit ConnectX-6 Dx, issue 15).

Pure: no I/O. Shared by every backend through the tenancy (shaperd/core/tenancy.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from shaperd.core.config import Config
from shaperd.core.inventory import Capabilities, Link

AUTO_EDT_MIN_BPS = 10_000_000_000


def edt_missing(caps: Capabilities) -> list[str]:
    """What this kernel lacks for the edt data plane (empty: it can run)."""
    missing = []
    for ok, module, name in ((caps.fq, "sch_fq", "sch_fq"), (caps.mq, "sch_mq", "mq")):
        if not ok:
            ev = caps.kind(module)  # the kernel's files, where no probe namespace could test it
            missing.append(f"{name} missing ({ev[1]})" if ev and ev[0] == "absent" else f"{name} missing")
    if not caps.bpf:
        missing.append("cls_bpf/bpf() unavailable")
    elif not caps.bpf_maps:
        # The stamper paces by the tenant class the map classifier wrote into skb->priority; without it
        # every packet would be "no tenant" and share the reserve (u32 on the HTB root cannot help here).
        missing.append("the eBPF map classifier unavailable (u32 path)")
    return missing


def select(cfg: Config, links: tuple[Link, ...] | list[Link], caps: Capabilities,
           refused: Mapping[str, tuple[int, str]] | None = None) -> tuple[dict[str, str], list[str]]:
    """device name -> "htb" | "edt" for each uplink, and the warnings an operator must see.

    ``refused``: device -> (ifindex, reason) where an apply found the kernel refuses edt
    (backends/edt/refusals.py); honoured only while the device has that ifindex (a new device is re-verified)."""
    mode = cfg.node.dataplane
    out: dict[str, str] = {}
    warnings: list[str] = []
    missing = edt_missing(caps)
    refused = refused or {}
    for link in links:
        if mode == "htb":
            out[link.name] = "htb"
        elif not missing and refused.get(link.name, (None,))[0] == link.ifindex:
            out[link.name] = "htb"
            warnings.append(f"node.dataplane {mode} on {link.name}: edt refused: {refused[link.name][1]}; "
                            "enforcing with htb")
        elif missing:
            out[link.name] = "htb"
            if mode == "edt":
                warnings.append(f"node.dataplane edt on {link.name}: edt unavailable: {', '.join(missing)}; "
                                "enforcing with htb")
        elif mode == "edt":
            out[link.name] = "edt"
        else:  # auto
            capacity = cfg.node.capacity_bps or link.speed_bps or 0
            out[link.name] = "edt" if capacity >= AUTO_EDT_MIN_BPS else "htb"
    if mode == "auto" and missing and links:
        warnings.append(f"node.dataplane auto: edt unavailable: {', '.join(missing)}; every uplink uses htb")
    return out, warnings
