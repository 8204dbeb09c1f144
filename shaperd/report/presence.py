"""Which tenants have something on this node: the tenants whose per-tenant series the node exports by default.

A tenant is *present* on a node when the last reconcile found at least one of these there:

- a pod: a pod on this node mapped to the tenant (its labels, namespace or Volcano queue; ``Tenancy.pod_tenants``);
- an address: the IP of a pod on this node (any pod, hostNetwork ones included) inside one of the tenant's
  ``match.cidrs``;
- a host interface: an interface named by its ``match.interfaces`` that exists here and is shaped
  (``Tenancy.interfaces``);
- a cgroup: one of its ``match.cgroups`` found on this node (``Inventory.cgroups`` holds only the found ones);
- an RDMA device: one of its ``rdma.devices`` that exists here (the RDMA plan's ``resolve``).

The inventory holds no addresses of the node's own interfaces, so on a node without Kubernetes discovery (bare
metal: the pods are not known) a tenant with ``match.cidrs`` counts as present: a tenant that may be sending
from this node is never hidden. With Kubernetes discovery, cidrs are checked against the pods' IPs only.

``SeriesFilter`` holds the answer for the collectors: ``None`` (``shaperd run --metrics-all-tenants``) exports
every tenant; otherwise a frozenset replaced whole after each reconcile, so a tenant that becomes present has
its series from the next scrape on. Pure, but for that one swapped reference.
"""

from __future__ import annotations

import ipaddress

from shaperd.core.config import Config
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import Tenancy


def present_tenants(cfg: Config, inv: Inventory, ten: Tenancy, *, pods_known: bool) -> frozenset[str]:
    """The names of the tenants of ``cfg`` present on the node ``inv`` describes (see the module docstring).

    ``pods_known``: the node runs Kubernetes discovery, so ``inv.pods`` is every pod here (else cidrs count)."""
    from shaperd.rdma.plan import resolve

    out: set[str] = set(ten.pod_tenants.values())
    out.update(tenant for tenant, _ifname in ten.interfaces.values())
    found_cgroups = {c.path for c in inv.cgroups}
    ips = []
    for pod in inv.pods:
        for ip in pod.ips:
            try:
                ips.append(ipaddress.ip_address(ip))
            except ValueError:
                continue
    for t in cfg.tenants:
        if t.name in out:
            continue
        m = t.match
        if m.cidrs and (not pods_known or any(ip in net for net in m.cidrs for ip in ips if ip.version == net.version)):
            out.add(t.name)
        elif any(path in found_cgroups for path in m.cgroups):
            out.add(t.name)
        elif any(resolve(ref, inv.rdma) for ref in t.rdma.devices):
            out.add(t.name)
    return frozenset(out)


class SeriesFilter:
    """Which tenants' series a scrape exports: every one (``present is None``) or the present ones."""

    def __init__(self, all_tenants: bool = False):
        self.all_tenants = all_tenants
        # Nothing is known present before the first reconcile (there are no tenant series yet either).
        self.present: frozenset[str] | None = None if all_tenants else frozenset()

    def set_present(self, tenants: frozenset[str]) -> None:
        """After a reconcile: the tenants present now (ignored with all_tenants)."""
        if not self.all_tenants:
            self.present = frozenset(tenants)

    def wanted(self, tenant: str) -> bool:
        p = self.present
        return p is None or tenant in p
