"""Plan each tenant's devlink rate node, pure: its name, tx_share/tx_max, and the VFs that are its leaves.

A tenant's VFs are the VFs among its RDMA devices (backends/rdma/plan.py:
``rdma.devices`` and the devices its pods hold), each named by its PF's
devlink handle (discovery: ``<bus>/<device>`` of the PF, ``pci/<pf>`` where
unknown) and its VF number there; its devlink port is found by diff.py
(flavour pcivf, the PF's pfnum, that vfnum). Non-VF devices (a
dedicated HCA, a PF) are not leaves of anything: no rate group for them.

tx_share = guarantee / 8 and tx_max = limit / 8 (bits/s to bytes/s), rounded
down to whole Mbit/s (UNIT_BPS: what drivers take; a limit at least 1 Mbit/s;
no limit: tx_max 0, unlimited). A tenant with VFs on N devlink devices
gets a node on each with 1/N of both: the aggregate never exceeds what the
tenants file says (a tenant busy on one device gets less than its limit;
said in a warning). tx_share never exceeds a non-zero tx_max.
"""

from __future__ import annotations

from shaperd.core.config import Config
from shaperd.core.errors import ConfigProblem
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import Tenancy
from shaperd.rdma import plan as rdma_plan
from shaperd.backends.devlink.objects import DevlinkPlan, TenantNode, Vf, node_name

# Rates are whole Mbit/s (125,000 B/s): the drivers refuse anything else with EINVAL ("TX rate value not
# in link speed units of 1Mbps": netdevsim, mlx5). Rounded down, so a node never gets more than planned;
# a set limit is at least 1 Mbit/s (0 would be "unlimited").
UNIT_BPS = 125_000


def plan(cfg: Config, inv: Inventory, ten: Tenancy) -> DevlinkPlan:
    rp = rdma_plan.plan(cfg, inv, ten)
    warnings: list[str] = []
    problems: list[ConfigProblem] = []
    by_name: dict[str, list[int]] = {}
    for i, t in enumerate(cfg.tenants):
        by_name.setdefault(node_name(t.name), []).append(i)
    clashing = set()
    for name, idx in by_name.items():
        if len(idx) > 1:
            who = ", ".join(cfg.tenants[i].name for i in idx)
            for i in idx:
                clashing.add(cfg.tenants[i].name)
                problems.append(ConfigProblem(f"tenants[{i}].name", f"devlink rate node name {name} is shared by "
                                              f"tenants {who}: none of them gets a rate group"))
    nodes: list[TenantNode] = []
    for t in sorted(cfg.tenants, key=lambda t: t.name):
        tr = rp.tenant(t.name)
        if tr is None or t.name in clashing:
            continue
        vfs: dict[str, set[Vf]] = {}
        for dev_name in sorted({p.device for p in tr.ports}):
            dev = inv.rdma_device(dev_name)
            if dev is None or not dev.is_vf or not dev.pf_pci:
                continue
            if dev.vf_index is None:
                warnings.append(f"tenant {t.name}: VF {dev_name} ({dev.pci}) has no VF number under its PF "
                                f"{dev.pf_pci}: not put into a devlink rate group")
                continue
            inst = dev.pf_devlink or f"pci/{dev.pf_pci}"
            vfs.setdefault(inst, set()).add(Vf(inst, dev.vf_index, dev_name, dev.pf_netdev))
        if not vfs:
            continue
        n = len(vfs)
        share = t.guarantee_bps // 8 // n // UNIT_BPS * UNIT_BPS
        mx = max(UNIT_BPS, t.limit_bps // 8 // n // UNIT_BPS * UNIT_BPS) if t.limit_bps else 0
        if mx and share > mx:
            warnings.append(f"tenant {t.name}: guarantee above its limit: devlink tx_share capped at tx_max")
            share = mx
        if n > 1:
            warnings.append(f"tenant {t.name}: VFs on {n} devlink devices ({', '.join(sorted(vfs))}): each rate node "
                            f"gets 1/{n} of its guarantee and limit")
        for inst in sorted(vfs):
            nodes.append(TenantNode(t.name, inst, node_name(t.name), share, mx,
                                    tuple(sorted(vfs[inst], key=lambda v: v.vf))))
    nodes.sort(key=lambda n: (n.instance, n.node))
    return DevlinkPlan(tuple(nodes), tuple(problems), tuple(warnings))
