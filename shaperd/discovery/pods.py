"""Turn the pods the API reports into inventory Pods: where their packets enter the node.

For a pod with an IP: the route to it gives the host-side interface (a
routed veth, as Calico and Cilium set up); if that is a bridge, the
neighbour and FDB tables give the bridge port (bridge and flannel plugins).
For a hostNetwork pod: its cgroup v2 directory from the pod UID. What
cannot be resolved yet is recorded as a problem and retried next time.
"""

from __future__ import annotations

import socket
from pathlib import Path

from shaperd.core.errors import KernelError
from shaperd.core.podcaps import EGRESS_ANNOTATION, INGRESS_ANNOTATION, NotAString
from shaperd.core.inventory import Link, Pod
from shaperd.discovery import cgroups


def route_oif(reader, ip: str) -> int | None:
    """Interface a local endpoint is reached on directly (no gateway), or None."""
    r = reader.route_to(ip)
    if r is None or r.via_gateway or r.oif is None:
        return None
    return r.oif


def bridge_port_of(reader, bridge_ifindex: int, ip: str) -> int | None:
    """The bridge port behind which ``ip`` lives: neighbour entry (IP -> MAC), then FDB (MAC -> port)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    want = socket.inet_pton(family, ip)
    dev = str(bridge_ifindex)
    mac = next((n.lladdr for n in reader.neighbours(family, bridge_ifindex, dev)
                if n.ifindex == bridge_ifindex and n.dst == want and n.lladdr is not None), None)
    if mac is None:
        return None
    return next((n.ifindex for n in reader.neighbours(socket.AF_BRIDGE, 0, dev)
                 if n.lladdr == mac and n.master == bridge_ifindex), None)


def resolve(reader, pod_infos, links: tuple[Link, ...], cgroup_root: Path | None) -> tuple[Pod, ...]:
    """``reader``: kernel.rtnl.RtnlReader in the node's network namespace."""
    by_index = {l.ifindex: l for l in links}
    out = []
    for info in sorted(pod_infos, key=lambda p: p.uid):
        problems: list[str] = []
        host_ifindex = host_ifname = None
        cg = None
        if info.host_network:
            if cgroup_root is None:
                problems.append("no cgroup v2 hierarchy mounted: hostNetwork pod cannot be recognised")
            else:
                cg = cgroups.pod_cgroup(cgroup_root, info.uid)
                if cg is None:
                    problems.append(f"no cgroup found for pod uid {info.uid} under {cgroup_root}")
        elif not info.ips:
            problems.append("no pod IP yet")
        else:
            for ip in info.ips:
                try:
                    oif = route_oif(reader, ip)
                except KernelError as e:
                    # e.g. EINVAL for an address under a blackhole route (Calico's IPAM blocks): this
                    # pod's problem, retried next time; the other pods are still resolved.
                    problems.append(str(e))
                    continue
                link = by_index.get(oif) if oif else None
                if link is None:
                    continue
                if link.kind == "bridge":
                    port = bridge_port_of(reader, link.ifindex, ip)
                    link = by_index.get(port) if port else None
                    if link is None:
                        problems.append(f"{ip} is behind bridge {by_index[oif].name} but its port is not known yet")
                        continue
                if link.kind in ("veth", "netkit"):
                    host_ifindex, host_ifname = link.ifindex, link.name
                    break
            if host_ifindex is None and not problems:
                problems.append(f"no local host interface routes to {', '.join(info.ips)}")
        out.append(
            Pod(
                uid=info.uid, namespace=info.namespace, name=info.name,
                labels=tuple(sorted(info.labels.items())), ips=tuple(info.ips), host_network=info.host_network,
                host_ifindex=host_ifindex, host_ifname=host_ifname, cgroup=cg, problems=tuple(problems),
                volcano_queue=getattr(info, "volcano_queue", None),
                egress_bandwidth=_annotation(info, EGRESS_ANNOTATION),
                ingress_bandwidth=_annotation(info, INGRESS_ANNOTATION),
            )
        )
    return tuple(out)


def _annotation(info, key: str) -> str | None:
    """A kept annotation's raw value (core/podcaps.py parses it); None where the pod has none. A value that
    is not a string stays, as NotAString, so it is refused and reported rather than dropped."""
    ann = getattr(info, "annotations", None) or {}
    v = ann.get(key)
    if v is None or isinstance(v, str):
        return v
    return NotAString(f"<{type(v).__name__}>")
