"""Stable ids derived from identity: HTB class minors, skb->mark values, BPF program names, IFB device names.

Derived from tenant names (and program content), never from "what is free
right now", so a restarted agent finds and adopts its own objects. Shared by
the backends and by ``shaperd status`` (which labels classes without a
daemon). Pure: no I/O.
"""

from __future__ import annotations

import hashlib

# Root qdisc handle major: "sh" in ASCII. Fixed, so ownership is recognisable
# from a dump alone and a restarted agent adopts its own tree.
HANDLE_MAJOR = 0x7368
# Tenant minors are derived from the tenant name inside this range.
TENANT_MINOR_FIRST = 0x10
TENANT_MINOR_LAST = 0xFFF0


def assign_minors(names: list[str] | tuple[str, ...], taken_minors: frozenset[int] = frozenset()) -> dict[str, int]:
    """Class minor per tenant, derived from its name (stable across restarts).

    A hash of the name picks the slot; collisions are resolved by probing in
    name order, so the result depends only on the set of names. The root
    handle's major is skipped because leaf qdisc majors equal class minors.
    """
    span = TENANT_MINOR_LAST - TENANT_MINOR_FIRST + 1
    taken = {HANDLE_MAJOR, *taken_minors}  # taken_minors: tenants' classes, when assigning their scope leaves
    out: dict[str, int] = {}
    for name in sorted(names):
        h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % span
        minor = TENANT_MINOR_FIRST + h
        while minor in taken:
            minor = TENANT_MINOR_FIRST + (minor - TENANT_MINOR_FIRST + 1) % span
        taken.add(minor)
        out[name] = minor
    return out


def assign_marks(names: list[str] | tuple[str, ...], mask: int, taken_marks: frozenset[int] = frozenset(),
                 salt: bytes = b"mark\0") -> dict[str, int]:
    """skb->mark value per tenant inside ``mask``, derived from the name like class minors.

    Tenants beyond the mask's capacity get no mark (tenancy warns). ``taken_marks`` (already shifted
    values) are skipped: capped pods get theirs after the tenants' (``salt`` b"podmark\0", by uid).
    """
    shift = (mask & -mask).bit_length() - 1
    span = mask >> shift  # values 1..span (0 means "no tenant")
    out: dict[str, int] = {}
    taken: set[int] = {m >> shift for m in taken_marks}
    for name in sorted(names):
        if len(taken) >= span:
            break
        v = 1 + int.from_bytes(hashlib.sha256(salt + name.encode()).digest()[:4], "big") % span
        while v in taken:
            v = 1 + v % span
        taken.add(v)
        out[name] = v << shift
    return out


def pod_class_name(uid: str) -> str:
    """The identity a capped pod's class minor is derived from (assign_minors), beside tenants and scopes."""
    return f"pod\0{uid}"


def bpf_program_name(mapping: tuple[tuple[int, ...], ...], kind: str = "") -> str:
    """Stable BPF object name (<= 15 chars) identifying a generated program's content."""
    digest = hashlib.sha256((kind + repr(sorted(mapping))).encode()).hexdigest()[:10]
    return f"shpd{kind[:1]}_{digest}"[:15]


# The tenant-ingress IFB of an uplink (backends/ingress/): "shpi-" (shaperd ingress) and the uplink's name, or,
# where that would pass the kernel's 15 characters, its first 4 characters and 6 hex of a hash of the whole name.
IFB_PREFIX = "shpi-"
IFNAME_MAX = 15


def ifb_name(uplink: str) -> str:
    """The IFB device fed from ``uplink``'s ingress: 'shpi-eth0'; 'shpi-enp1' + 6 hex for a long name.

    Derived from the uplink's name alone, so a restarted agent finds its IFB again without saved state."""
    if len(IFB_PREFIX) + len(uplink) <= IFNAME_MAX:
        return IFB_PREFIX + uplink
    digest = hashlib.sha256(uplink.encode()).hexdigest()
    return (IFB_PREFIX + uplink[:IFNAME_MAX - len(IFB_PREFIX) - 6] + digest[:6])[:IFNAME_MAX]


def is_ifb_name(name: str) -> bool:
    """A name shaperd gives its tenant-ingress IFBs (``ifb_name``)."""
    return name.startswith(IFB_PREFIX) and len(name) > len(IFB_PREFIX)
