"""Which data plane enforces each uplink: ``node.dataplane`` (htb | edt | auto) against link and kernel.

The rule (documented in README, "EDT data plane"):

- ``htb``: every uplink gets the HTB tree (the default).
- ``edt``: every uplink gets mq + sch_fq + the stamper, if the kernel has
  sch_fq, mq and cls_bpf and the eBPF map classifier is in use; otherwise HTB, with a warning naming what is missing
  (bad input never costs enforcement).
- ``auto``: edt where the kernel has all three AND the uplink's capacity
  (node.capacity, else the reported link speed) is at least
  ``AUTO_EDT_MIN_BPS``; htb everywhere else. Below that rate one HTB lock
  carries the load (on the 2-vCPU test VM every isolation target held at 1 and
  5 Gbit, and failed at 10 Gbit); above it the per-device lock is the limit
  (6.7 Gbit/s software HTB on a 100 Gbit ConnectX-6 Dx, issue 15).

Pure: no I/O. Shared by every backend through the tenancy (shaperd/tenancy.py).
"""

from __future__ import annotations

from ...config import Config
from ...inventory import Capabilities, Link

AUTO_EDT_MIN_BPS = 10_000_000_000


def edt_missing(caps: Capabilities) -> list[str]:
    """What this kernel lacks for the edt data plane (empty: it can run)."""
    missing = []
    if not caps.fq:
        missing.append("sch_fq missing")
    if not caps.mq:
        missing.append("mq missing")
    if not caps.bpf:
        missing.append("cls_bpf/bpf() unavailable")
    elif not caps.bpf_maps:
        # The stamper paces by the tenant class the map classifier wrote into skb->priority; without it
        # every packet would be "no tenant" and share the reserve (u32 on the HTB root cannot help here).
        missing.append("the eBPF map classifier unavailable (u32 path)")
    return missing


def select(cfg: Config, links: tuple[Link, ...] | list[Link], caps: Capabilities) -> tuple[dict[str, str], list[str]]:
    """device name -> "htb" | "edt" for each uplink, and the warnings an operator must see."""
    mode = cfg.node.dataplane
    out: dict[str, str] = {}
    warnings: list[str] = []
    missing = edt_missing(caps)
    for link in links:
        if mode == "htb":
            out[link.name] = "htb"
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
