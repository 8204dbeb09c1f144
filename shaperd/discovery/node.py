"""Discover what is on this node: links, their speeds, default-route devices.

Turns the kernel's raw facts into an Inventory for the planner. Link speed
comes from sysfs (root injectable for tests); virtual devices (veth,
bridge, vxlan, ...) report nominal speeds (veth says 10 Gbit whatever the
path) that mean nothing, so shaperd ignores them and asks for
node.capacity instead.
"""

from __future__ import annotations

from pathlib import Path

from ..inventory import Capabilities, Inventory, Link


def read_speed_bps(name: str, sysfs_root: str | Path = "/sys") -> int | None:
    """The link speed the driver reports, or None (down links and virtual devices report -1 or nothing)."""
    try:
        text = (Path(sysfs_root) / "class" / "net" / name / "speed").read_text().strip()
        mbit = int(text)
    except (OSError, ValueError):
        return None
    if mbit <= 0 or mbit >= 0xFFFFFFFF:  # SPEED_UNKNOWN is -1 / 0xffffffff
        return None
    return mbit * 10**6


def discover(reader, capabilities: Capabilities, sysfs_root: str | Path = "/sys") -> Inventory:
    """``reader``: kernel.tcstats.StatsReader in the node's network namespace."""
    raw = reader.link_list()
    by_index = {l.ifindex: l for l in raw}
    links = tuple(
        Link(
            name=l.name,
            ifindex=l.ifindex,
            kind=l.kind,
            speed_bps=None if l.kind else read_speed_bps(l.name, sysfs_root),
            mtu=l.mtu,
            up=l.up,
        )
        for l in raw
    )
    defaults = tuple(by_index[i].name for i in reader.default_route_ifindexes() if i in by_index)
    return Inventory(links=links, default_route_devices=defaults, capabilities=capabilities)
