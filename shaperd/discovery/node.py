"""Discover what is on this node: links, their speeds, default-route devices.

Turns the kernel's rows into an Inventory for the planner. Link speed comes
from sysfs (under Roots, so tests use fixture trees); virtual devices
(veth, bridge, vxlan, ...) report nominal speeds (veth says 10 Gbit whatever
the path) that mean nothing, so shaperd ignores them and asks for
node.capacity instead.
"""

from __future__ import annotations

import socket

from shaperd.core.inventory import Capabilities, Inventory, Link
from shaperd.kernel.rtnl_rows import RouteRow
from shaperd.core.roots import DEFAULT, Roots

RT_TABLE_MAIN, RTN_UNICAST = 254, 1


def read_speed_bps(name: str, roots: Roots = DEFAULT) -> int | None:
    """The link speed the driver reports, or None (down links and virtual devices report -1 or nothing)."""
    try:
        mbit = int((roots.net_class(name) / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    if mbit <= 0 or mbit >= 0xFFFFFFFF:  # SPEED_UNKNOWN is -1 / 0xffffffff
        return None
    return mbit * 10**6


def default_route_ifindexes(v4: list[RouteRow], v6: list[RouteRow]) -> list[int]:
    """Output devices of the main table's default routes (IPv4 first, then IPv6), by metric."""
    found: list[tuple[int, int, int]] = []
    for n, routes in enumerate((v4, v6)):
        for r in routes:
            if r.dst_len != 0 or r.table != RT_TABLE_MAIN or r.type != RTN_UNICAST:
                continue
            if r.oif is not None:
                found.append((n, r.metric, r.oif))
            found.extend((n, r.metric, hop) for hop in r.multipath_oifs)
    return list(dict.fromkeys(i for _, _, i in sorted(found)))


def discover(reader, capabilities: Capabilities, roots: Roots = DEFAULT) -> Inventory:
    """``reader``: kernel.rtnl.RtnlReader in the node's network namespace."""
    raw = reader.links()
    by_index = {l.ifindex: l for l in raw}
    links = tuple(
        Link(name=l.name, ifindex=l.ifindex, kind=l.kind,
             speed_bps=None if l.kind else read_speed_bps(l.name, roots), mtu=l.mtu, up=l.up, tx_queues=l.tx_queues)
        for l in raw
    )
    defaults = default_route_ifindexes(reader.routes(socket.AF_INET), reader.routes(socket.AF_INET6))
    return Inventory(links=links, default_route_devices=tuple(by_index[i].name for i in defaults if i in by_index),
                     capabilities=capabilities)
