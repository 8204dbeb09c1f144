"""The HTB offload device probe: can this uplink's driver take an offloaded HTB root? Read-only.

Two facts per device, neither of which writes anything to it:

- the driver: the ``device/driver`` link in sysfs (under Roots, so tests use
  fixture trees), else the rtnetlink link kind (veth, bridge: no device
  directory);
- whether ``hw-tc-offload`` (NETIF_F_HW_TC) is ACTIVE: ethtool generic
  netlink (kernel/ethtool_features.py). sch_htb's htb_init refuses offload
  with EOPNOTSUPP "hw-tc-offload ethtool feature flag must be on" otherwise.

A device is capable when both hold and its driver is one known to implement
TC_SETUP_QDISC_HTB (HTB_OFFLOAD_DRIVERS). ``node.htbOffload: on`` ignores
this verdict (for drivers this list does not know); ``auto`` follows it.
The result goes into the inventory (Link.htb_offload); the planner decides.
"""

from __future__ import annotations

import os
from dataclasses import replace

from shaperd.core.errors import KernelError
from shaperd.core.inventory import HtbOffloadSupport, Inventory, Link
from shaperd.kernel import ethtool_features
from shaperd.core.roots import DEFAULT, Roots

# Drivers that implement ndo_setup_tc(TC_SETUP_QDISC_HTB) and whose limits offload.py models.
# Source: drivers/net/ethernet/mellanox/mlx5/core/en/htb.c, qos.c (HTB offload since Linux 5.12,
# "net/mlx5e: Support HTB offload", 214baf22870c). octeontx2 (rvu_nicpf, 6.3+) also offloads HTB,
# with prio and quantum, but its limits are not modelled here: use node.htbOffload: on to try it.
HTB_OFFLOAD_DRIVERS = {"mlx5_core": "mlx5 (ConnectX-5 and later)"}


def driver_of(link: Link, roots: Roots = DEFAULT) -> str:
    """The driver's name: sysfs device/driver, else the link kind ("veth"), else ""."""
    try:
        return os.path.basename(os.readlink(roots.net_class(link.name) / "device" / "driver"))
    except OSError:
        return link.kind


def support(device: str, driver: str, features: ethtool_features.Features | None,
            features_error: str = "") -> HtbOffloadSupport:
    """The verdict from the two facts (pure)."""
    why: list[str] = []
    known = driver in HTB_OFFLOAD_DRIVERS
    if not known:
        why.append(f"driver {driver or 'unknown'} is not known to offload HTB (known: "
                   f"{', '.join(sorted(HTB_OFFLOAD_DRIVERS))})")
    if features is None:
        why.append(f"ethtool features unreadable ({features_error})")
    elif ethtool_features.HW_TC_OFFLOAD not in features.active:
        fix = (f"ethtool -K {device} hw-tc-offload on" if ethtool_features.HW_TC_OFFLOAD in features.hw
               else "fixed off by the driver")
        why.append(f"hw-tc-offload is off ({fix})")
    if why:
        return HtbOffloadSupport(False, "; ".join(why), driver)
    return HtbOffloadSupport(True, f"{driver}, hw-tc-offload on", driver)


class DeviceProbe:
    """Probes the named links of an inventory, through one generic netlink socket per call."""

    def __init__(self, netns: str | None = None, roots: Roots = DEFAULT, opener=None):
        self.netns = netns
        self.roots = roots
        # The ethtool family id, resolved by the first probe and handed to the next sockets: it is fixed
        # for the kernel's lifetime, so a reconcile's probe is one round trip per uplink, not one more.
        self._family: int | None = None
        self.opener = opener or (lambda: ethtool_features.EthtoolNl(self.netns, run_root=str(self.roots.run),
                                                                     family=self._family))

    def probe(self, links: list[Link]) -> dict[str, HtbOffloadSupport]:
        out: dict[str, HtbOffloadSupport] = {}
        if not links:
            return out
        try:
            nl = self.opener()
        except KernelError as e:
            return {l.name: support(l.name, driver_of(l, self.roots), None, str(e)) for l in links}
        with nl:
            for link in links:
                feats, err = None, ""
                try:
                    feats = nl.features(link.ifindex, link.name)
                    self._family = nl.family()  # resolved by features(): no round trip
                except KernelError as e:
                    err = str(e)
                out[link.name] = support(link.name, driver_of(link, self.roots), feats, err)
        return out

    def annotate(self, inv: Inventory, links: list[Link]) -> Inventory:
        """``inv`` with Link.htb_offload filled in for ``links`` (the uplinks)."""
        found = self.probe(links)
        if not found:
            return inv
        return replace(inv, links=tuple(replace(l, htb_offload=found[l.name]) if l.name in found else l
                                        for l in inv.links))
