"""The eBPF map classifier as data: its map entries, their key encoding, the entry diff, its operations.

The classifier (kernel/bpf_classify.py builds and attaches it) is one
direct-action cls_bpf program on the uplink's clsact egress hook. It looks
a packet up in these maps, in this order (the documented precedence):

1. ``ifindex``: skb->ingress_ifindex -> classid (hash);
2. ``cgroup``: for each level in ``cglevels`` (array, level + 1, 0 = unused),
   bpf_skb_ancestor_cgroup_id(skb, level) -> classid (hash, u64 key);
3. ``mark``: skb->mark & node.mark_mask -> classid (hash; 0 never matches);
4. ``src4`` / ``src6``: source address -> classid (LPM tries: longest wins);

then, once a tenant classid is known, the destination scope stage:
5. ``dst4`` / ``dst6``: (tenant classid, destination) -> classid (LPM tries
   keyed by the classid as 32 fixed bits, then the address).

It writes the result to skb->priority (HTB takes a leaf class whose id equals
skb->priority without consulting filters) and returns TC_ACT_UNSPEC, so later
clsact programs still run. Unmatched packets keep their skb->priority.

The destination-keyed variant (``key="dst"``, program ``shpd_d*``, its own
prio/handle 0x7369) runs on the clsact egress of the tenant-ingress IFB
(backends/ingress/): it has only the address stage, keyed on the packet's
destination (``src4``/``src6`` then hold destination prefixes), so what
arrives for a tenant's pods and addresses lands in its class there.

This module owns the key/value layout (bytes, host order for integers,
network order for addresses, as the kernel compares them), the desired
entries from a plan, and the diff of desired against observed entries.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import ipaddress
import struct
from dataclasses import dataclass, field
from typing import ClassVar

from shaperd.core.protocol import Operation, TargetDiff
from shaperd.backends.common import clsact
from shaperd.backends.common.objects import DstScope

# Bump when the program's semantics change: the name changes, so a running
# older program is replaced (with fresh maps) instead of adopted.
GENERATOR_VERSION = 1
# clsact egress priority and handle of shaperd's classifier ("sh"). Other
# programs that must see the classid (the EDT stamper) use a larger prio.
PRIO_EGRESS_CLASSIFY = 0x7368
HANDLE_EGRESS_CLASSIFY = 0x7368
# The destination-keyed variant's own (on an ingress IFB): never taken for the source classifier by the
# backends that look for theirs at 0x7368 on every clsact egress (htb, edt).
PRIO_DST_CLASSIFY = 0x7369
HANDLE_DST_CLASSIFY = 0x7369
CGROUP_LEVELS_MAX = 4

ROLES = ("ifindex", "cglevels", "cgroup", "mark", "src4", "src6", "dst4", "dst6")
# role -> (map type name, key bytes, value bytes, max entries)
MAP_SHAPES = {
    "ifindex": ("hash", 4, 4, 65536),
    "cglevels": ("array", 4, 4, CGROUP_LEVELS_MAX),
    "cgroup": ("hash", 8, 4, 65536),
    "mark": ("hash", 4, 4, 65536),
    "src4": ("lpm_trie", 8, 4, 1 << 20),
    "src6": ("lpm_trie", 20, 4, 1 << 20),
    "dst4": ("lpm_trie", 12, 4, 1 << 16),
    "dst6": ("lpm_trie", 24, 4, 1 << 16),
}

_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")

Entries = dict[str, dict[bytes, bytes]]


def program_name(mark_mask: int) -> str:
    """'shpd_c' + 9 hex: generator version and the mark mask (baked into the bytecode)."""
    h = hashlib.sha256(f"shaperd-mapcls-v{GENERATOR_VERSION}\0{mark_mask:08x}".encode()).hexdigest()
    return "shpd_c" + h[:9]


def is_ours(name: str) -> bool:
    return len(name) == 15 and name.startswith("shpd_c")


def dst_program_name() -> str:
    """'shpd_d' + 9 hex: the destination-keyed variant's generator version (it bakes in no mark mask)."""
    h = hashlib.sha256(f"shaperd-mapcls-dst-v{GENERATOR_VERSION}".encode()).hexdigest()
    return "shpd_d" + h[:9]


def is_ours_dst(name: str) -> bool:
    return len(name) == 15 and name.startswith("shpd_d")


# key -> (clsact egress prio, handle, name check): where each variant sits and how its program is known.
VARIANTS = {"src": (PRIO_EGRESS_CLASSIFY, HANDLE_EGRESS_CLASSIFY, is_ours),
            "dst": (PRIO_DST_CLASSIFY, HANDLE_DST_CLASSIFY, is_ours_dst)}


def roles(key: str = "src") -> tuple[str, ...]:
    """The maps a variant's program uses (and so holds, and is adopted by): all, or the address tries."""
    return ROLES if key == "src" else ("src4", "src6")


def owns_clsact_filter(row) -> bool:
    """A clsact filter row (rtnl_rows.FilterRow) is shaperd's map classifier: egress, its prio, handle and name."""
    return (row.parent == clsact.EGRESS and row.kind == "bpf" and row.prio == PRIO_EGRESS_CLASSIFY
            and row.handle == HANDLE_EGRESS_CLASSIFY and is_ours(row.name))


def value(classid: int) -> bytes:
    return _U32.pack(classid)


def u32_key(n: int) -> bytes:
    return _U32.pack(n)


def cgroup_key(cgroup_id: int) -> bytes:
    return _U64.pack(cgroup_id)


def src_key(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    """struct bpf_lpm_trie_key { u32 prefixlen; u8 addr[] } for a source prefix."""
    return _U32.pack(net.prefixlen) + net.network_address.packed


def dst_key(tenant_classid: int, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bytes:
    """(tenant classid as 32 leading bits, destination prefix): the tenant must match in full."""
    return _U32.pack(32 + net.prefixlen) + struct.pack(">I", tenant_classid) + net.network_address.packed


def decode_key(role: str, key: bytes) -> str:
    """A key for people (logs, status): '198.18.0.0/24', 'ifindex 7', '7368:10 -> 198.18.9.0/24'."""
    if role in ("ifindex", "mark", "cglevels"):
        return f"{role} {_U32.unpack(key)[0]:#x}" if role == "mark" else f"{role} {_U32.unpack(key)[0]}"
    if role == "cgroup":
        return f"cgroup {_U64.unpack(key)[0]}"
    plen = _U32.unpack_from(key)[0]
    if role.startswith("src"):
        return str(ipaddress.ip_address(key[4:])) + f"/{plen}"
    cls = struct.unpack_from(">I", key, 4)[0]
    return f"{cls >> 16:x}:{cls & 0xFFFF:x} -> {ipaddress.ip_address(key[8:])}/{plen - 32}"


@dataclass(frozen=True)
class MapClassifier:
    """Desired: the classifier program (by name) and every map's entries."""

    name: str
    mark_mask: int
    entries: Entries = field(compare=False, hash=False)
    # "src": the uplinks' classifier; "dst": the destination-keyed variant (the ingress IFB's), see above.
    key: str = "src"

    def count(self) -> int:
        return sum(len(v) for r, v in self.entries.items() if r != "cglevels")


@dataclass
class ObservedMapClassifier:
    """Found on clsact egress: our filter, its program and its maps' entries."""

    name: str
    prog_id: int
    handle: int
    prio: int
    entries: Entries = field(default_factory=dict)
    # Set when the program or a map could not be read: the maps are then rebuilt.
    error: str | None = None


def build(mark_mask: int, ifindex: dict[int, int], cgroups, marks: dict[int, int],
          prefixes: dict, dst_scopes: tuple[DstScope, ...] = ()) -> tuple[MapClassifier, list[str]]:
    """Desired entries. ``cgroups``: (level, id, classid); ``marks``: mark value -> classid;
    ``prefixes``: network -> classid. Returns the classifier and warnings (entries not expressible)."""
    warnings: list[str] = []
    e: Entries = {r: {} for r in ROLES}
    for idx, cls in sorted(ifindex.items()):
        e["ifindex"][u32_key(idx)] = value(cls)
    levels = sorted({lvl for lvl, _, _ in cgroups})
    if len(levels) > CGROUP_LEVELS_MAX:
        warnings.append(f"cgroups at {len(levels)} distinct levels; the eBPF classifier checks the first "
                        f"{CGROUP_LEVELS_MAX} ({levels[:CGROUP_LEVELS_MAX]}), deeper ones are not matched")
        levels = levels[:CGROUP_LEVELS_MAX]
    for slot in range(CGROUP_LEVELS_MAX):
        e["cglevels"][u32_key(slot)] = u32_key(levels[slot] + 1 if slot < len(levels) else 0)
    for lvl, cgid, cls in sorted(cgroups):
        if lvl in levels:
            e["cgroup"].setdefault(cgroup_key(cgid), value(cls))
    for mark, cls in sorted(marks.items()):
        m = mark & mark_mask
        if m:
            e["mark"][u32_key(m)] = value(cls)
    for net, cls in prefixes.items():
        e["src4" if net.version == 4 else "src6"][src_key(net)] = value(cls)
    for s in dst_scopes:
        e["dst4" if s.prefix.version == 4 else "dst6"][dst_key(s.tenant_classid, s.prefix)] = value(s.classid)
    return MapClassifier(program_name(mark_mask), mark_mask, e), warnings


def build_dst(prefixes: dict) -> MapClassifier:
    """The destination-keyed variant's entries: ``prefixes`` (destination network -> classid) in the address
    tries, every other map empty (its program reads none of them)."""
    mc, _ = build(0, {}, (), {}, prefixes)
    return MapClassifier(dst_program_name(), 0, {r: mc.entries[r] for r in roles("dst")}, key="dst")


def diff_entries(want: dict[bytes, bytes], have: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """(entries to write, keys to delete) so ``have`` becomes ``want``; both empty when in sync."""
    upserts = {k: v for k, v in want.items() if have.get(k) != v}
    deletes = sorted(k for k in have if k not in want)
    return upserts, deletes


# ---------------------------------------------------------------- operations


@dataclass(frozen=True, kw_only=True)
class AttachMapClassifier(Operation):
    """Create the maps, fill them, load the program and attach it on clsact egress (replacing ours)."""

    classifier: MapClassifier
    verb: ClassVar[str] = "attach"

    def what(self) -> str:
        return f"bpf classifier {self.classifier.name} ({self.classifier.count()} entries) on clsact egress"


@dataclass(frozen=True, kw_only=True)
class UpdateClassifierMap(Operation):
    """Write and delete entries of one map of the attached classifier (found by program id)."""

    prog_id: int
    role: str
    upserts: tuple[tuple[bytes, bytes], ...] = ()
    deletes: tuple[bytes, ...] = ()
    key: str = "src"  # the classifier's variant: which maps its program holds
    verb: ClassVar[str] = "update"

    def what(self) -> str:
        return f"bpf classifier map {self.role} (+{len(self.upserts)} -{len(self.deletes)}, prog id {self.prog_id})"


@dataclass(frozen=True, kw_only=True)
class DetachMapClassifier(Operation):
    """Remove shaperd's own classifier filter from clsact egress (its maps go with the program)."""

    prio: int = PRIO_EGRESS_CLASSIFY
    handle: int = HANDLE_EGRESS_CLASSIFY
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"bpf classifier prio {self.prio} handle 0x{self.handle:x} on clsact egress"


@dataclass(frozen=True, kw_only=True)
class UnpinMapClassifier(Operation):
    """Remove shaperd's bpffs pins for a device it no longer classifies with maps (or a crash's leftovers).

    ``device`` is the pin entry's name; the device itself may be gone (ifindex 0)."""

    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return "bpffs pins of the eBPF map classifier"


def stale_pins(entries, keep: set[str], reason: str) -> list[TargetDiff]:
    """Unpin every pinned device entry not in ``keep`` (shared by the backends that pin the classifier)."""
    return [TargetDiff(f"{name} (bpffs pins)", ops=[UnpinMapClassifier(device=name, ifindex=0, reason=reason)])
            for name in entries or () if name not in keep]


def diff(dev: str, idx: int, want: MapClassifier | None, have: ObservedMapClassifier | None) -> list[Operation]:
    """The writes that make the device's classifier match; none when in sync."""
    if want is None:  # at the prio and handle it was found at (each variant has its own)
        return [DetachMapClassifier(device=dev, ifindex=idx, prio=have.prio, handle=have.handle,
                                    reason="u32 path or not wanted")] if have else []
    if have is None or have.name != want.name or have.error:
        why = ("missing" if have is None else have.error or f"program {have.name} is another version")
        return [AttachMapClassifier(device=dev, ifindex=idx, classifier=want, reason=why)]
    ops: list[Operation] = []
    for role in roles(want.key):
        up, dels = diff_entries(want.entries.get(role, {}), have.entries.get(role, {}))
        if up or dels:
            ops.append(UpdateClassifierMap(device=dev, ifindex=idx, prog_id=have.prog_id, role=role,
                                           upserts=tuple(sorted(up.items())), deletes=tuple(dels),
                                           key=want.key, reason="entries differ"))
    return ops
