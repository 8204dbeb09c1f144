"""Which uplinks get an offloaded HTB root, and the plan in offload shape. Pure.

Input, all as data: the mode (``node.htbOffload``), each uplink's device
probe (Link.htb_offload, discovery/htb_offload.py), the software-shaped
device plans (plan.py), and the devices whose kernel refused an offloaded
root or class earlier (the backend remembers those, keyed by ifindex and
name, and passes them in: no state is read here).

- ``off``: never. ``auto``: where the device probe says capable and
  offload.verdict has no reason. ``on``: wherever the verdict has no reason
  but the device probe's (the kernel's answer decides).
- A device the kernel refused stays in software HTB (no retry, no flapping)
  until it goes away (new ifindex) or the daemon restarts.
- Offload shape: the root carries the offload flag; every class has prio 0
  and quantum 0 (mlx5 refuses both; the kernel then picks quantum from the
  rate and the NIC shares spare in proportion to rate, see offload.py); no
  filters (verdict requires none); the default class is kept (mlx5 sends a
  packet whose skb->priority is not one of the tree's classes to defcls).

What the default class loses: in software HTB it is at prio 7 and borrows
only what no tenant wants; offloaded, it shares spare bandwidth with the
tenants in proportion to its rate (node.reserve, 1 % of capacity by
default). Each DevicePlan's ``offload_why`` says why offload is on or off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from shaperd.core.config import Config
from shaperd.core.inventory import Inventory
from shaperd.backends.common.objects import DevicePlan
from shaperd.backends.htb.offload import verdict

DEFAULT_CLASS_NOTE = "the default class shares spare bandwidth in proportion to its rate, not last"


def offload_shape(dp: DevicePlan, why: str) -> DevicePlan:
    """``dp`` as the offloaded tree: offload flag on the root, no prio, quantum left to the kernel."""
    return replace(dp, root=replace(dp.root, offload=True),
                   classes=tuple(replace(c, prio=0, quantum_bytes=0) for c in dp.classes), offload_why=why)


def choose_device(mode: str, dp: DevicePlan, inv: Inventory, refused: str | None) -> tuple[DevicePlan, list[str]]:
    """(the device plan, warnings naming the device) for one uplink."""
    if mode == "off":
        return replace(dp, offload_why="node.htbOffload is off"), []
    if refused is not None:
        why = (f"the kernel refused htb offload on {dp.device}: {refused}; software HTB until the device "
               "goes away or the daemon restarts")
        return replace(dp, offload_why=why), [f"htb offload: {why}"]
    link = inv.link(dp.device)
    probe = link.htb_offload if link is not None else None
    capable = probe is not None and probe.capable
    probe_why = probe.why if probe is not None else "the device was not probed"
    v = verdict(dp, supported=capable or mode == "on", why_not=probe_why)
    if not v.possible:
        why = "; ".join(v.reasons)
        # Told as a warning where offload was wanted and possible on the device side; a NIC that
        # cannot offload (most of them) under auto is normal, and only status says why.
        warn = [f"htb offload on {dp.device} not used: {why}"] if capable or mode == "on" else []
        return replace(dp, offload_why=why), warn
    how = probe_why if capable else f"node.htbOffload is on (device probe: {probe_why})"
    return offload_shape(dp, f"{how}; {DEFAULT_CLASS_NOTE}"), []


def choose(cfg: Config, inv: Inventory, plan, refused: Mapping[tuple[int, str], str]):
    """The HtbPlan with each device in software or offload shape, and the warnings."""
    devices, warnings = [], list(plan.warnings)
    for dp in plan.devices:
        out, warns = choose_device(cfg.node.htb_offload, dp, inv, refused.get((dp.ifindex, dp.device)))
        devices.append(out)
        warnings.extend(w for w in warns if w not in warnings)
    return replace(plan, devices=tuple(devices), warnings=tuple(warnings))
