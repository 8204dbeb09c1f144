"""The devlink backend's data, pure: node names, the desired groups, and the rate objects found.

Names: a tenant's node is ``shpd_<tenant>`` (the ``shpd_`` prefix marks what
shaperd owns; nodes without it are never touched). Where the tenant name is
too long for NAME_MAX_CHARS (iproute2 prints ``bus/dev/node`` into a 64-byte
buffer) the name is ``shpd_<stem>_<8 hex of sha256(tenant)>``; the planner
detects the (unlikely) case of two tenants with one name and plans neither.
Names never are a bare number (devlink would read those as port indexes).

Rates are bytes per second, as devlink carries them; 0 is "unset"
(tx_share: no guarantee; tx_max: unlimited).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

PREFIX = "shpd_"
# "pci/0000:3b:00.0/" (17) + the node name stays well inside iproute2's 64-byte handle buffer, and so do
# auxiliary devices ("auxiliary/mlx5_core.sf.12/", 26).
NAME_MAX_CHARS = 32
HASH_CHARS = 8
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
# devlink_port_flavour: what a devlink port is a function of
FLAVOUR_PCI_PF, FLAVOUR_PCI_VF = 3, 4


def node_name(tenant: str) -> str:
    """The tenant's rate node name: deterministic, prefixed, at most NAME_MAX_CHARS."""
    if _SAFE.match(tenant) and len(PREFIX) + len(tenant) <= NAME_MAX_CHARS:
        return PREFIX + tenant
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:HASH_CHARS]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", tenant)[:NAME_MAX_CHARS - len(PREFIX) - HASH_CHARS - 1]
    return f"{PREFIX}{stem}_{digest}"


def owned(name: str | None) -> bool:
    return bool(name) and name.startswith(PREFIX)


@dataclass(frozen=True)
class Vf:
    """A tenant's VF: its PF's devlink device and its VF number there (the devlink port's vfnum)."""

    instance: str  # "pci/0000:3b:00.0"
    vf: int
    device: str  # the RDMA device it came from, for messages
    pf_netdev: str | None = None  # the PF's netdev: finds the PF's own devlink port (its pfnum), where it has one


@dataclass(frozen=True)
class TenantNode:
    """One tenant's rate node on one devlink device."""

    tenant: str
    instance: str
    node: str
    tx_share_Bps: int  # the guarantee (its share on this device), bytes/s
    tx_max_Bps: int  # the limit, bytes/s; 0: unlimited
    vfs: tuple[Vf, ...] = ()


@dataclass(frozen=True)
class DevlinkPlan:
    nodes: tuple[TenantNode, ...] = ()
    problems: tuple = ()
    warnings: tuple[str, ...] = ()

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(sorted({n.instance for n in self.nodes}))


@dataclass(frozen=True)
class Rate:
    """A rate object found: a node (``node``) or a port's leaf (``port_index``)."""

    instance: str
    node: str | None = None
    port_index: int | None = None
    tx_share_Bps: int = 0
    tx_max_Bps: int = 0
    parent: str | None = None


@dataclass(frozen=True)
class Port:
    instance: str
    index: int
    flavour: int | None = None
    vf: int | None = None
    controller: int | None = None
    pf: int | None = None  # pfnum (flavours pcipf, pcivf, pcisf)
    netdev: str | None = None


@dataclass(frozen=True)
class DevlinkObserved:
    rates: tuple[Rate, ...] = ()
    ports: tuple[Port, ...] = ()
    error: str | None = None  # the rate objects could not be read: nothing is diffed
