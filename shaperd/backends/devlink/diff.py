"""Diff the wanted rate nodes against the rate objects found, pure: per devlink device, the writes in order.

Order: create missing nodes, set the share/max that differ, parent the
tenants' leaves (a leaf under another shaperd node is un-parented first: the
kernel refuses a second parent with EBUSY), un-parent leaves left under a shaperd node that no longer
wants them, then delete stale shaperd nodes (a node must exist before a leaf
is parented to it; a node's leaves are un-parented before it is deleted).

Ownership: nodes without shaperd's prefix are never touched; a wanted leaf
whose parent is such a node is reported and left where it is; the parent of
a shaperd node (an operator may nest it) and the leaves' own rates (the VF
rates backend's, on mlx5 the same knob) are not shaperd's to change. A
stale shaperd node that still has a child node is left, and said. An
in-sync device gives no operation.
"""

from __future__ import annotations

from shaperd.core.protocol import TargetDiff
from shaperd.backends.devlink.objects import (FLAVOUR_PCI_PF, FLAVOUR_PCI_VF, DevlinkObserved, DevlinkPlan, Port, Rate,
                                              TenantNode, Vf, owned)
from shaperd.backends.devlink.ops import CreateRateNode, DeleteRateNode, SetLeafParent, SetRateNode


def _vf_ports(ports: list[Port]) -> dict[tuple[int | None, int], Port]:
    """(pfnum, vfnum) -> its port, for the local host's VFs (controller 0 or unset)."""
    return {(p.pf, p.vf): p for p in ports if p.flavour == FLAVOUR_PCI_VF and p.vf is not None and not p.controller}


def _vf_port(vf: Vf, ports: list[Port], vf_port: dict) -> tuple[Port | None, str]:
    """A VF's devlink port as a real NIC names it: on its PF's devlink device, flavour pcivf with the PF's
    pfnum and the VF's vfnum. The PF's pfnum is its own pcipf port's (by the PF's netdev); where the PF
    has none (mlx5's uplink is flavour physical, netdevsim's too), the one pfnum the device's local VF
    ports carry. Several and none of them the PF's: the VF is not guessed (the reason comes back)."""
    own = [p.pf for p in ports if p.flavour == FLAVOUR_PCI_PF and not p.controller and p.netdev
           and p.netdev == vf.pf_netdev]
    pfnums = sorted({pf for pf, _ in vf_port}, key=lambda x: -1 if x is None else x)
    if own:
        pf = own[0]
    elif len(pfnums) == 1:
        pf = pfnums[0]
    elif not pfnums:
        return None, f"{vf.instance} has no VF ports"
    else:
        return None, (f"{vf.instance} has VF ports of PFs {', '.join(map(str, pfnums))} and no pcipf port of "
                      f"{vf.pf_netdev or 'its PF'}: which is VF {vf.vf}'s is not guessed")
    port = vf_port.get((pf, vf.vf))
    return port, "" if port is not None else f"no port of flavour pcivf pfnum {pf} vfnum {vf.vf}"


def diff_instance(instance: str, want: list[TenantNode], rates: list[Rate], ports: list[Port]) -> TargetDiff:
    out = TargetDiff(instance)
    notes: list[str] = []
    if want and not rates:
        out.blocked = (f"{instance} has no devlink rate objects (not a switchdev eswitch, or its driver has no rate "
                       f"support): no rate group for tenant(s) {', '.join(sorted(n.tenant for n in want))}")
        return out
    nodes = {r.node: r for r in rates if r.node is not None}
    leaves = {r.port_index: r for r in rates if r.port_index is not None}
    vf_port = _vf_ports(ports)
    wanted = {n.node: n for n in want}
    for n in want:
        have = nodes.get(n.node)
        if have is None:
            out.ops.append(CreateRateNode(device=instance, ifindex=0, tenant=n.tenant, node=n.node,
                                          tx_share_Bps=n.tx_share_Bps or None, tx_max_Bps=n.tx_max_Bps or None,
                                          reason="missing"))
            continue
        share = n.tx_share_Bps if have.tx_share_Bps != n.tx_share_Bps else None
        mx = n.tx_max_Bps if have.tx_max_Bps != n.tx_max_Bps else None
        if share is not None or mx is not None:
            out.ops.append(SetRateNode(device=instance, ifindex=0, tenant=n.tenant, node=n.node, tx_share_Bps=share,
                                       tx_max_Bps=mx, reason=f"was tx_share {have.tx_share_Bps} B/s, tx_max "
                                       f"{have.tx_max_Bps} B/s"))
    placed: dict[int, str] = {}  # port index -> the shaperd node it belongs under
    for n in want:
        for vf in n.vfs:
            port, why = _vf_port(vf, ports, vf_port)
            if port is None:
                notes.append(f"VF {vf.vf} ({vf.device}) of tenant {n.tenant} has no devlink port on {instance}: {why}")
                continue
            leaf = leaves.get(port.index)
            if leaf is None:
                notes.append(f"port {instance}/{port.index} (VF {vf.vf}, tenant {n.tenant}) has no rate leaf")
                continue
            placed[port.index] = n.node
            if leaf.parent == n.node:
                continue
            if leaf.parent and not owned(leaf.parent):
                notes.append(f"leaf {instance}/{port.index} (VF {vf.vf}, tenant {n.tenant}) is under node "
                             f"{leaf.parent}, not shaperd's: left there")
                continue
            if leaf.parent:
                # The core refuses a new parent while one is set ("Rate object already has parent", EBUSY):
                # off the other shaperd node first.
                out.ops.append(SetLeafParent(device=instance, ifindex=0, tenant=n.tenant, port_index=port.index,
                                             parent="", reason=f"under {leaf.parent}: un-parented before the move"))
            out.ops.append(SetLeafParent(device=instance, ifindex=0, tenant=n.tenant, port_index=port.index,
                                         parent=n.node, reason=f"was under {leaf.parent or 'no node'}"))
    for idx in sorted(leaves):
        leaf = leaves[idx]
        if owned(leaf.parent) and idx not in placed:
            out.ops.append(SetLeafParent(device=instance, ifindex=0, port_index=idx, parent="",
                                         reason=f"under stale node {leaf.parent}: no tenant wants it there"))
    for name in sorted(nodes):
        if not owned(name) or name in wanted:
            continue
        children = sorted(r.node for r in nodes.values() if r.parent == name)
        if children:
            notes.append(f"stale node {name} left: node(s) {', '.join(children)} are under it")
            continue
        out.ops.append(DeleteRateNode(device=instance, ifindex=0, node=name,
                                      reason="stale: no tenant wants a rate group here"))
    if notes:
        out.blocked = "; ".join(notes)
    return out


def diff(desired: DevlinkPlan, observed: DevlinkObserved) -> list[TargetDiff]:
    want: dict[str, list[TenantNode]] = {}
    for n in desired.nodes:
        want.setdefault(n.instance, []).append(n)
    if observed.error is not None:
        return [TargetDiff(inst, error=observed.error) for inst in sorted(want)] or [
            TargetDiff("devlink", error=observed.error)]
    rates: dict[str, list[Rate]] = {}
    for r in observed.rates:
        rates.setdefault(r.instance, []).append(r)
    ports: dict[str, list[Port]] = {}
    for p in observed.ports:
        ports.setdefault(p.instance, []).append(p)
    touched = {inst for inst, rs in rates.items() if any(owned(r.node) or owned(r.parent) for r in rs)}
    out = []
    for inst in sorted(set(want) | touched):
        d = diff_instance(inst, sorted(want.get(inst, []), key=lambda n: n.node), rates.get(inst, []),
                          ports.get(inst, []))
        if d.ops or d.blocked or inst in want:
            out.append(d)
    return out
