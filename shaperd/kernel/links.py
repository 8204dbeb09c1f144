"""Links and default routes over rtnetlink: the raw facts discovery builds on.

Returns plain tuples/dicts; deciding what they mean (which devices to shape,
what their capacity is) is discovery's and the planner's job.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import KernelError


@dataclass(frozen=True)
class RawLink:
    name: str
    ifindex: int
    kind: str
    mtu: int
    up: bool


def list_links(ipr: IPRoute) -> list[RawLink]:
    try:
        msgs = list(ipr.get_links())
    except NetlinkError as e:
        raise KernelError("dump", "links", "node", os.strerror(e.code), e.code) from e
    out = []
    for m in msgs:
        info = m.get_attr("IFLA_LINKINFO")
        kind = (info.get_attr("IFLA_INFO_KIND") if info else None) or ""
        out.append(
            RawLink(
                name=m.get_attr("IFLA_IFNAME"),
                ifindex=m["index"],
                kind=kind,
                mtu=m.get_attr("IFLA_MTU") or 1500,
                up=bool(m["flags"] & 1),
            )
        )
    return out


def default_route_ifindexes(ipr: IPRoute) -> list[int]:
    """Output devices of the main table's default routes (IPv4 first, then IPv6)."""
    out: list[int] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            routes = list(ipr.get_routes(family=family, table=254))
        except NetlinkError as e:
            raise KernelError("dump", "routes", "node", os.strerror(e.code), e.code) from e
        for r in sorted(routes, key=lambda r: r.get_attr("RTA_PRIORITY") or 0):
            if r["dst_len"] != 0:
                continue
            oif = r.get_attr("RTA_OIF")
            if oif:
                out.append(oif)
            mp = r.get_attr("RTA_MULTIPATH") or []
            out.extend(h["oif"] for h in mp if h.get("oif"))
    return list(dict.fromkeys(out))


def route_oif(ipr: IPRoute, ip: str) -> int | None:
    """Interface a local endpoint ``ip`` is reached on directly, or None.

    A route through a gateway (the default route, an overlay's next hop) means
    the address does not live on this node.
    """
    try:
        routes = list(ipr.route("get", dst=ip))
    except NetlinkError:
        return None
    for r in routes:
        oif = r.get_attr("RTA_OIF")
        if oif and not r.get_attr("RTA_GATEWAY") and not r.get_attr("RTA_VIA"):
            return oif
    return None


def bridge_port_of(ipr: IPRoute, bridge_ifindex: int, ip: str) -> int | None:
    """The bridge port behind which ``ip`` lives: neighbour entry (IP -> MAC), then FDB (MAC -> port)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        neigh = [n for n in ipr.get_neighbours(family=family, ifindex=bridge_ifindex) if n.get_attr("NDA_DST") == ip]
        mac = next((n.get_attr("NDA_LLADDR") for n in neigh if n.get_attr("NDA_LLADDR")), None)
        if mac is None:
            return None
        for f in ipr.get_neighbours(family=socket.AF_BRIDGE):
            if f.get_attr("NDA_LLADDR") == mac and f.get_attr("NDA_MASTER") == bridge_ifindex:
                return f["ifindex"]
    except NetlinkError:
        return None
    return None
