"""Destination scopes in the HTB tree: a tenant's traffic towards some prefixes under its own cap.

Owns the shape of a scoped tenant (issue 12). Its class becomes an inner
class (rate = guarantee, ceil = the tenant's limit, as before) with one leaf
per scope and a "rest" leaf:

- scope leaf: ceil = the scope's limit (never above the tenant's), rate = an
  equal share of the tenant's guarantee (guarantee / (scopes + 1)), capped at
  the scope's limit;
- rest leaf: ceil = the tenant's limit, rate = the guarantee left over.

So the scope's limit caps the traffic towards it; the tenant's other traffic
keeps the tenant's own limit; the tenant's limit caps both together. Capped
pods (pods.py) are leaves of the same inner class and take their equal share
of the guarantee beside the scopes.

A capped pod's traffic towards a scoped destination goes to the scope's leaf,
not to the pod's: the scope's cap holds for the whole tenant, capped pods
included, and the pod's cap bounds its traffic to every other destination
(HTB puts a packet in one leaf, and the scope and the pod are two aggregates
that overlap). The map classifier does it with destination entries keyed by
the pod's class (``DstScope(pod class, prefix, scope leaf)``); the u32 path
classifies the pod to its tenant's class, whose chain tries the scopes first,
then the capped pods' source addresses, then "rest" (so on u32 a capped pod
whose packets no longer carry its address, after masquerade, lands in "rest":
its tenant's caps hold, its own does not).

Realised for every classifier at once: HTB runs an inner class's own filter
chain for any packet classified to it (htb_classify: filters, or
skb->priority, naming an inner class), so the chain under the tenant class
holds u32 destination-prefix filters (longest first) and a catch-all to
"rest". Whatever recognised the tenant (interface, cgroup, mark, source
prefix, the eBPF map classifier) needs no change. ``DstScope`` entries carry
the same mapping for classifiers that resolve scopes themselves.

Pure: no I/O.
"""

from __future__ import annotations

from shaperd.core.config import Tenant
from shaperd.core.ids import assign_minors
from shaperd.backends.htb.pods import MIN_POD_RATE_BPS, pod_rate
from shaperd.backends.common.objects import (
    ETH_P_ALL,
    ETH_P_IP,
    ETH_P_IPV6,
    PRIO_SCOPE_REST,
    DstScope,
    HtbClass,
    U32Filter,
    U32Key,
    classid,
    dst_prefix_keys,
    scope_prio,
)

# HTB refuses a zero rate; a scope with no share of the guarantee still gets 1 kB/s.
MIN_SCOPE_RATE_BPS = 8000


def scope_names(t: Tenant) -> list[str]:
    """Stable identities of a scoped tenant's leaves: "rest", then one per destination (by its prefixes)."""
    if not t.destinations:
        return []
    return [f"{t.name}\0rest"] + [f"{t.name}\0dst\0" + ",".join(sorted(map(str, d.cidrs))) for d in t.destinations]


def scope_minors(tenants, tenant_minors: dict[str, int]) -> dict[str, int]:
    """Minors of every scope leaf, never one of a tenant's (so adding a scope moves no tenant)."""
    names = [n for t in tenants for n in scope_names(t)]
    return assign_minors(names, frozenset(tenant_minors.values())) if names else {}


def scoped_tenant(
    t: Tenant, tenant_cls: HtbClass, minors: dict[str, int], make_class, pod_leaves=(), rest_cid: int | None = None,
) -> tuple[list[HtbClass], list[U32Filter], list[DstScope]]:
    """The leaves under an inner tenant class, the filters of its chain, and its DstScopes.

    ``make_class(cid, parent, rate_bps, ceil_bps, prio, tenant)`` sizes a class as the planner does.
    ``pod_leaves``: (classid, ceil_bps) of the tenant's capped pods (pods.py): the guarantee is shared
    among scopes, pods and rest alike (``g // (scopes + pods + 1)``; with no pod, as before).
    ``rest_cid``: the rest leaf of a tenant with pods and no scope (pods.tree_minors); else its scope name's.
    """
    names = scope_names(t)
    g, ceil = tenant_cls.rate_bps, tenant_cls.ceil_bps
    share = g // (len(t.destinations) + len(pod_leaves) + 1)
    classes: list[HtbClass] = []
    filters: list[U32Filter] = []
    scopes: list[DstScope] = []
    used = 0
    for name, d in zip(names[1:], t.destinations):
        cid = classid(minors[name])
        scope_ceil = min(d.limit_bps, ceil)
        rate = max(MIN_SCOPE_RATE_BPS, min(share, scope_ceil))
        used += rate
        classes.append(make_class(cid, tenant_cls.classid, rate, scope_ceil, tenant_cls.prio, t.name))
        for net in d.cidrs:
            scopes.append(DstScope(tenant_cls.classid, net, cid))
            filters.append(U32Filter(prio=scope_prio(net), protocol=ETH_P_IP if net.version == 4 else ETH_P_IPV6,
                                     classid=cid, keys=dst_prefix_keys(net), prefix=f"dst {net}",
                                     parent=tenant_cls.classid))
    for cid, pod_ceil in pod_leaves:
        rate = pod_rate(share, min(pod_ceil, ceil))
        used += rate
        classes.append(make_class(cid, tenant_cls.classid, rate, min(pod_ceil, ceil), tenant_cls.prio, t.name))
    rest = rest_cid if rest_cid is not None else classid(minors[names[0]])
    floor = MIN_SCOPE_RATE_BPS if t.destinations else MIN_POD_RATE_BPS
    classes.insert(0, make_class(rest, tenant_cls.classid, max(floor, g - used), ceil, tenant_cls.prio, t.name))
    filters.append(U32Filter(prio=PRIO_SCOPE_REST, protocol=ETH_P_ALL, classid=rest, keys=(U32Key(0, 0, 0),),  # tc's "match u32 0 0"
                             prefix="rest", parent=tenant_cls.classid))
    return classes, filters, scopes
