"""Capped pods in the HTB tree: each pod with an egress cap gets a leaf of its own, inside its tenant's guarantee.

Owns the shape (``kubernetes.io/egress-bandwidth``, core/podcaps.py) and the sharing rule:

- A tenant with at least one capped pod becomes an inner class (rate = guarantee, ceil = limit, as
  before) with a "rest" leaf (identity ``"<tenant>\\0rest"``, the one destination scopes use: the
  tenant's uncapped traffic) and one leaf per capped pod, beside any scope leaves (scopes.py).
- A pod leaf's ceil is ``min(cap, the tenant's ceil)``; its prio is the tenant's.
- Rates: the tenant's guarantee ``g`` is cut into ``n = pods + scopes + 1`` equal shares
  (``share = g // n``). A pod leaf gets ``min(share, its ceil)``, a scope leaf ``min(share, its
  limit)`` (scopes.py), and the rest leaf what is left (``g - the others``, at least one share).
  The children's rates add up to the guarantee exactly: it is never oversubscribed, and a pod's
  rate is only what it is guaranteed inside its tenant. Above it a pod borrows, up to its ceil,
  whatever its tenant-mates leave unused (and they borrow what it leaves).
- A pod of no tenant gets a class beside the default class (under the root, default prio 7, ceil
  ``min(cap, capacity)``); the rates are cut the same way out of the reserve: ``share = reserve //
  (pods + 1)``, each pod ``min(share, its ceil)``, the default class keeps the rest. The default
  class stays a leaf, and HTB's ``default`` keeps pointing at it (an inner default class would let
  unclassified traffic bypass shaping).

The extremes: with very many capped pods a share shrinks towards HTB's minimum, one byte per second
(``MIN_POD_RATE_BPS``: the kernel stores rates in whole bytes per second and refuses 0); a pod's
ceil is untouched, so it still sends up to its cap when its tenant has room, but under contention
inside the tenant it is guaranteed next to nothing. Only where the guarantee cannot even give every
child that minimum (``g < 8 bit/s x children``, or 1 kB/s per scope leaf) would the rates add up to
more than the guarantee; the plan warns there (``oversubscribed``). Class minors come from the pod's
uid (ids.pod_class_name), after every tenant and scope minor (classify.pod_minors), so a pod keeps
its class across restarts and its tenant-mates' churn.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from shaperd.backends.common.classify import pod_minors
from shaperd.core.ids import assign_minors

# HTB stores rates in whole bytes per second and refuses a zero rate: 1 B/s is its minimum.
MIN_POD_RATE_BPS = 8


@dataclass(frozen=True)
class PodClass:
    """A capped pod's class on every shaped uplink (the classid is the same on each)."""

    uid: str
    namespace: str
    name: str
    tenant: str | None  # None: a pod of no tenant (its class sits beside the default class)
    cap_bps: int  # the annotation's value; the class's ceil on a device may be lower (min with the tenant's)
    classid: int

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def rest_name(tenant: str) -> str:
    """Identity of a tenant's "rest" leaf (the same as a scoped tenant's: scopes.scope_names)."""
    return f"{tenant}\0rest"


def tree_minors(tenants, tenant_minors: dict[str, int], scope_minors: dict[str, int],
                capped: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(uid -> pod class minor, tenant -> rest-leaf minor for capped pods' tenants without scopes).

    ``capped``: uid -> PodCap (Tenancy.egress_capped()). Pod minors take every tenant and scope minor as
    taken (the rule edt shares, classify.pod_minors); the rest leaves of tenants that have no scope come
    after, so a pod's class never depends on which tenants have pods."""
    taken = set(tenant_minors.values()) | set(scope_minors.values())
    pods = pod_minors(capped, taken)
    with_pods = {c.tenant for c in capped.values() if c.tenant is not None}
    names = [rest_name(t.name) for t in tenants if t.name in with_pods and not t.destinations]
    rests = assign_minors(names, frozenset(taken | set(pods.values()))) if names else {}
    return pods, {n.split("\0", 1)[0]: m for n, m in rests.items()}


def share(total_bps: int, children: int) -> int:
    """One child's equal share of ``total_bps`` among ``children``."""
    return total_bps // max(1, children)


def pod_rate(share_bps: int, ceil_bps: int) -> int:
    """A pod leaf's rate: its share, never above its ceil, never below HTB's minimum."""
    return max(MIN_POD_RATE_BPS, min(share_bps, ceil_bps))


def beside_default(pods: list[PodClass], reserve_bps: int, capacity_bps: int) -> tuple[list[tuple[PodClass, int, int]], int]:
    """Pods of no tenant: ([(pod, rate, ceil)], the default class's rate), cut out of the reserve."""
    s = share(reserve_bps, len(pods) + 1)
    out = []
    used = 0
    for p in sorted(pods, key=lambda p: p.classid):
        ceil = min(p.cap_bps, capacity_bps)
        rate = pod_rate(s, ceil)
        used += rate
        out.append((p, rate, ceil))
    return out, max(MIN_POD_RATE_BPS, reserve_bps - used)
