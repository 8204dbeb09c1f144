"""The eBPF map classifier on the kernel side: bytecode, maps, attach on clsact egress, adopt, read, write.

Owns: generating the direct-action program (hand-built bytecode, no
compiler), creating its maps (layout in backends/common/mapcls.py), attaching it
as shaperd's own cls_bpf filter (prio/handle 0x7368; the destination-keyed
variant of the ingress IFB at 0x7369) on the device's clsact egress hook, finding it again after a restart (filter dump TCA_BPF_ID ->
program fd -> map ids -> map fds), reading the maps, and executing the
classifier operations (one bpf() write per map changed).

Adoption, in this order of preference (the probe picks one): through bpffs
pins (kernel/bpf_pins.py: ``<root>/shaperd/<scope>/<backend>/<device>/{prog,map_<role>}``,
CAP_BPF and file permissions suffice), accepted only if the pinned program's
id equals the TCA_BPF_ID in the filter dump and every pinned map is one of
that program's maps, else the classifier is replaced and re-pinned; or by id
(TCA_BPF_ID -> BPF_PROG_GET_FD_BY_ID -> map ids -> BPF_MAP_GET_FD_BY_ID),
which needs CAP_SYS_ADMIN. The attached filter stays the reference that
keeps the classifier working: pins only let a new process find the maps.

Must not: touch a clsact filter that is not its own (other agents share the
hook), delete the clsact qdisc, or decide map contents.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELTFILTER, RTM_NEWQDISC, RTM_NEWTFILTER

from shaperd.core.protocol import ApplyResult, Operation
from shaperd.backends.common import mapcls
from shaperd.backends.common.clsact import CLSACT_HANDLE, TC_H_CLSACT
from shaperd.backends.common.clsact import TC_H_EGRESS_PARENT as TC_H_CLSACT_EGRESS
from shaperd.backends.common.mapcls import MAP_SHAPES, ROLES, MapClassifier, ObservedMapClassifier
from shaperd.core.errors import KernelError
from shaperd.kernel import bpf, bpf_maps, bpf_pins
from shaperd.kernel.tc import msg as _tcmsg  # one tcmsg builder for every hand-built tc request

ETH_P_ALL = 0x0003
_MAP_TYPES = {"hash": bpf_maps.MAP_HASH, "array": bpf_maps.MAP_ARRAY, "lpm_trie": bpf_maps.MAP_LPM_TRIE}
_MAP_NAMES = {r: f"shpd_{r}" for r in ROLES}


def _names(key: str) -> dict[str, str]:
    return {r: _MAP_NAMES[r] for r in mapcls.roles(key)}
PIN_PROG = bpf_pins.PIN_PROG
_PIN_MAPS = {r: bpf_pins.pin_map(r) for r in ROLES}

# __sk_buff offsets (uapi linux/bpf.h)
_SKB_MARK, _SKB_PROTOCOL, _SKB_PRIORITY, _SKB_INGRESS_IFINDEX = 8, 16, 32, 36
_SKB_DATA, _SKB_DATA_END = 76, 80
_FN_MAP_LOOKUP, _FN_ANCESTOR_CGROUP_ID = 1, 83
_ETH_P_IP_BE, _ETH_P_IPV6_BE = 0x0008, 0xDD86  # skb->protocol as a little-endian u32 load


# ------------------------------------------------------------- a tiny assembler

class _Asm:
    """Instructions with symbolic jump targets; ``code()`` resolves them."""

    def __init__(self):
        self.items: list = []
        self.labels: dict[str, int] = {}
        self.pc = 0

    def raw(self, b: bytes) -> None:
        self.items.append(b)
        self.pc += len(b) // 8

    def i(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> None:
        self.raw(bpf._insn(code, dst, src, off, imm))

    def jmp(self, code: int, dst: int, label: str, imm: int = 0, src: int = 0) -> None:
        self.items.append((self.pc, code, dst, src, imm, label))
        self.pc += 1

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(f"label {name} defined twice")
        self.labels[name] = self.pc

    def code(self) -> bytes:
        out = []
        for it in self.items:
            if isinstance(it, bytes):
                out.append(it)
            else:
                pc, code, dst, src, imm, label = it
                out.append(bpf._insn(code, dst, src, self.labels[label] - pc - 1, imm))
        return b"".join(out)


_LDXW, _LDXDW, _STXW, _STXDW, _STW = 0x61, 0x79, 0x63, 0x7B, 0x62
_MOV64X, _MOV32X, _MOV32K, _ADD64K, _ADD32K, _AND32K, _BE = 0xBF, 0xBC, 0xB4, 0x07, 0x04, 0x54, 0xDC
_JA, _JEQK, _JGTX, _JEQ32K, _CALL, _EXIT = 0x05, 0x15, 0x2D, 0x16, 0x85, 0x95
_LSH64K, _OR64X = 0x67, 0x4F


def classifier_program(fds: dict[str, int], mark_mask: int, key: str = "src") -> bytes:
    """The program for map fds {role: fd} (see backends/htb/mapcls.py for the stages).

    Registers: r6 = skb, r7 = classid found (0 = none), r8 = skb->protocol.
    Stack: fp-8 u32 hash key, fp-16 u64 cgroup key, fp-32.. source LPM key,
    fp-40.. destination LPM key.

    Every key is written in whole 8-byte stack slots (two u32 halves joined in a register, the unused
    half 0), never as two 4-byte writes into one slot: without CAP_PERFMON (the DaemonSet's NET_ADMIN +
    BPF) the 6.1 verifier saves a bounded u32 written at an 8-aligned offset as a spilled register and
    then refuses any narrower write into that slot ("attempt to corrupt spilled pointer on stack"), so
    the program did not load there at all.

    The stages run in this order; the first that finds a tenant jumps to "dst" (or "dst4"/"dst6" when
    the packet's family is already known), a miss falls through to the next stage.

    ``key="dst"``: the destination-keyed variant (mapcls.py): the address stage alone, looking up the
    packet's destination address instead of its source, its result written at once.
    """
    a = _ClassifierAsm(fds)
    _prologue(a)
    if key == "dst":
        _by_address(a, "dst")
        _verdict(a)
        return a.code()
    _by_ingress_ifindex(a)  # 1
    _by_cgroup_ancestors(a)  # 2
    _by_mark(a, mark_mask)  # 3
    _by_source_prefix(a)  # 4
    _by_destination_scope(a)  # 5
    _verdict(a)
    return a.code()


class _ClassifierAsm(_Asm):
    """The assembler with the classifier's idioms: map lookups, stack keys, packet bounds."""

    def __init__(self, fds: dict[str, int]):
        super().__init__()
        self.fds = fds

    def lookup(self, role: str, key_off: int, miss: str) -> None:
        """r0 = the ``role`` map's value for the key at fp+key_off; a miss jumps to ``miss``."""
        self.i(_MOV64X, 2, 10)
        self.i(_ADD64K, 2, 0, 0, key_off)
        self.raw(bpf_maps.ld_map_fd(1, self.fds[role]))
        self.i(_CALL, imm=_FN_MAP_LOOKUP)
        self.jmp(_JEQK, 0, miss, 0)

    def found(self, then: str) -> None:
        """r7 = the classid in the value just looked up; go on at ``then``."""
        self.i(_LDXW, 7, 0, 0)
        self.jmp(_JA, 0, then)

    def slot(self, off: int, lo: int | None, hi: int | None) -> None:
        """fp[off..off+8) = lo | hi << 32: lo, hi registers holding u32 values (None: 0). Clobbers r4, r5."""
        if lo is None:
            self.i(_MOV32K, 4, 0, 0, 0)
        elif lo != 4:
            self.i(_MOV64X, 4, lo)
        if hi is not None:
            if hi != 5:
                self.i(_MOV64X, 5, hi)
            self.i(_LSH64K, 5, 0, 0, 32)
            self.i(_OR64X, 4, 5)
        self.i(_STXDW, 10, 4, off)

    def packet(self, min_len: int, miss: str) -> None:
        """r2 = skb->data, r3 = skb->data_end; jump to ``miss`` unless ``min_len`` bytes are there."""
        self.i(_LDXW, 2, 6, _SKB_DATA)
        self.i(_LDXW, 3, 6, _SKB_DATA_END)
        self.i(_MOV64X, 4, 2)
        self.i(_ADD64K, 4, 0, 0, min_len)
        self.jmp(_JGTX, 4, miss, src=3)


def _prologue(a: _ClassifierAsm) -> None:
    a.i(_MOV64X, 6, 1)
    a.i(_MOV32K, 7, 0, 0, 0)
    a.i(_LDXW, 8, 6, _SKB_PROTOCOL)


def _by_ingress_ifindex(a: _ClassifierAsm) -> None:
    """1. the interface the packet came in on (a pod's veth)."""
    a.i(_LDXW, 2, 6, _SKB_INGRESS_IFINDEX)
    a.slot(-8, 2, None)
    a.lookup("ifindex", -8, "cg0")
    a.found("dst")


def _by_cgroup_ancestors(a: _ClassifierAsm) -> None:
    """2. the socket's cgroup ancestors at the configured levels (labels cg0..cgN)."""
    for n in range(mapcls.CGROUP_LEVELS_MAX):
        a.label(f"cg{n}")
        nxt = f"cg{n + 1}" if n + 1 < mapcls.CGROUP_LEVELS_MAX else "mark"
        a.i(_MOV32K, 4, 0, 0, n)
        a.slot(-8, 4, None)
        a.lookup("cglevels", -8, "mark")
        a.i(_LDXW, 2, 0, 0)
        a.jmp(_JEQ32K, 2, "mark", 0)  # levels are packed from slot 0: an empty slot ends the list
        a.i(_ADD32K, 2, 0, 0, -1)
        a.i(_MOV64X, 1, 6)
        a.i(_CALL, imm=_FN_ANCESTOR_CGROUP_ID)
        a.jmp(_JEQK, 0, nxt, 0)  # no socket (forwarded) or not that deep
        a.i(_STXDW, 10, 0, -16)
        a.lookup("cgroup", -16, nxt)
        a.found("dst")


def _by_mark(a: _ClassifierAsm, mark_mask: int) -> None:
    """3. the packet mark under the node's mask (a zero mark is no mark)."""
    a.label("mark")
    a.i(_LDXW, 2, 6, _SKB_MARK)
    a.i(_AND32K, 2, 0, 0, mark_mask)
    a.jmp(_JEQ32K, 2, "src", 0)
    a.slot(-8, 2, None)
    a.lookup("mark", -8, "src")
    a.found("dst")


def _by_source_prefix(a: _ClassifierAsm) -> None:
    """4. the source address, longest prefix wins (LPM); neither IPv4 nor IPv6, or no match: "out"."""
    _by_address(a, "src")


# Where the address a variant looks up sits in the IPv4 and IPv6 headers, and where a hit goes on.
_ADDRESS_AT = {"src": (12, 8, "dst4", "dst6"), "dst": (16, 24, "write", "write")}


def _by_address(a: _ClassifierAsm, key: str) -> None:
    """The address tries: the source address (4. above) or, in the destination-keyed variant, the destination;
    longest prefix wins (LPM); neither IPv4 nor IPv6, or no match: "out"."""
    v4_off, v6_off, then4, then6 = _ADDRESS_AT[key]
    a.label("src")
    a.jmp(_JEQ32K, 8, "src4", _ETH_P_IP_BE)
    a.jmp(_JEQ32K, 8, "src6", _ETH_P_IPV6_BE)
    a.jmp(_JA, 0, "out")
    a.label("src4")
    a.packet(14 + 20, "out")
    a.i(_LDXW, 5, 2, 14 + v4_off)  # {prefixlen 32, address}
    a.i(_MOV32K, 4, 0, 0, 32)
    a.slot(-32, 4, 5)
    a.lookup("src4", -32, "out")
    a.found(then4)
    a.label("src6")
    a.packet(14 + 40, "out")
    # {prefixlen 128, address w0..w3}: slots fp-32 (128, w0), fp-24 (w1, w2), fp-16 (w3, 0)
    a.i(_MOV32K, 4, 0, 0, 128)
    a.i(_LDXW, 5, 2, 14 + v6_off)
    a.slot(-32, 4, 5)
    a.i(_LDXW, 4, 2, 14 + v6_off + 4)
    a.i(_LDXW, 5, 2, 14 + v6_off + 8)
    a.slot(-24, 4, 5)
    a.i(_LDXW, 4, 2, 14 + v6_off + 12)
    a.slot(-16, 4, None)
    a.lookup("src6", -32, "out")
    a.found(then6)


def _by_destination_scope(a: _ClassifierAsm) -> None:
    """5. the destination scope of the tenant found: {prefixlen, classid, daddr} may pick another class."""
    a.label("dst")
    a.jmp(_JEQ32K, 8, "dst4", _ETH_P_IP_BE)
    a.jmp(_JEQ32K, 8, "dst6", _ETH_P_IPV6_BE)
    a.jmp(_JA, 0, "write")
    for fam, alen, daddr in (("dst4", 4, 14 + 16), ("dst6", 16, 14 + 24)):
        a.label(fam)
        a.packet(14 + (20 if alen == 4 else 40), "write")
        # {prefixlen, classid (big-endian), daddr}: fp-40 (prefixlen, classid), then the address words
        for w in range(0, alen // 4, 2):
            a.i(_LDXW, 4, 2, daddr + 4 * w)
            if w + 1 < alen // 4:
                a.i(_LDXW, 5, 2, daddr + 4 * (w + 1))
            a.slot(-32 + 4 * w, 4, 5 if w + 1 < alen // 4 else None)
        a.i(_MOV32X, 5, 7)
        a.i(_BE, 5, 0, 0, 32)
        a.i(_MOV32K, 4, 0, 0, 32 + 8 * alen)
        a.slot(-40, 4, 5)
        a.lookup(fam, -40, "write")
        a.found("write")


def _verdict(a: _ClassifierAsm) -> None:
    """skb->priority = the classid found (label "write"), then TC_ACT_UNSPEC (label "out", where a packet
    that matched nothing goes unchanged)."""
    a.label("write")
    a.i(_STXW, 6, 7, _SKB_PRIORITY)
    a.label("out")
    a.i(_MOV32K, 0, 0, 0, bpf.TC_ACT_UNSPEC)
    a.i(_EXIT)


# --------------------------------------------------------------------- maps

class ClassifierMaps:
    """The classifier's open maps by role (created fresh, or adopted from a program id)."""

    def __init__(self, maps: dict[str, bpf_maps.BpfMap]):
        self.maps = maps

    @classmethod
    def create(cls, key: str = "src") -> ClassifierMaps:
        maps: dict[str, bpf_maps.BpfMap] = {}
        try:
            for role in mapcls.roles(key):
                kind, ks, vs, n = MAP_SHAPES[role]
                maps[role] = bpf_maps.create_map(_MAP_TYPES[kind], ks, vs, n, _MAP_NAMES[role])
        except BaseException:
            for m in maps.values():
                m.close()
            raise
        return cls(maps)

    @classmethod
    def adopt(cls, prog_id: int, key: str = "src") -> ClassifierMaps:
        """The maps of the attached program ``prog_id`` (BpfMapError if it is gone or not ours)."""
        return cls(bpf_maps.maps_of_prog(prog_id, _names(key), "classifier"))

    @classmethod
    def adopt_pinned(cls, pins: bpf_pins.PinStore, device: str, prog_id: int, key: str = "src") -> ClassifierMaps:
        """The maps pinned for ``device``, if its pinned program is the attached ``prog_id`` and every
        pinned map is one of that program's (BpfMapError otherwise: the classifier is then replaced)."""
        return cls(bpf_pins.adopt_pinned(pins, device, prog_id, _names(key), "classifier"))

    @classmethod
    def open(cls, pins: bpf_pins.PinStore | None, device: str, prog_id: int, key: str = "src") -> ClassifierMaps:
        """Through the pins when they are in use, else by id (CAP_SYS_ADMIN); ``key``: the variant (its maps)."""
        return cls.adopt_pinned(pins, device, prog_id, key) if pins is not None else cls.adopt(prog_id, key)

    def pin_files(self) -> dict[str, int]:
        return {_PIN_MAPS[r]: m.fd for r, m in self.maps.items()}

    def close(self) -> None:
        for m in self.maps.values():
            m.close()

    def __enter__(self) -> ClassifierMaps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fds(self) -> dict[str, int]:
        return {r: m.fd for r, m in self.maps.items()}

    def read(self) -> dict[str, dict[bytes, bytes]]:
        return {r: m.items() for r, m in self.maps.items()}

    def write(self, role: str, upserts, deletes) -> int:
        """Apply one map's changes; returns the number of bpf() write syscalls."""
        m = self.maps[role]
        n = m.update_batch(list(upserts)) if upserts else 0
        return n + (m.delete_batch(list(deletes)) if deletes else 0)


def load(maps: ClassifierMaps, mark_mask: int, name: str, key: str = "src") -> int:
    """Load the program (``key``: its variant) against ``maps``; returns its fd (the caller closes it after
    attaching)."""
    return bpf.load_sched_cls(classifier_program(maps.fds(), mark_mask, key), name)


# ------------------------------------------------------------- observe

def observe(filter_rows, device: str, pins: bpf_pins.PinStore | None = None,
            key: str = "src") -> ObservedMapClassifier | None:
    """Our classifier (``key``: the variant, at its own prio and handle) among the clsact egress filter rows
    of one device, with its maps' entries."""
    prio, handle, is_ours = mapcls.VARIANTS[key]
    ours = [f for f in filter_rows if f.kind == "bpf" and f.prio == prio and f.handle == handle]
    if not ours:
        return None
    f = ours[0]
    obs = ObservedMapClassifier(name=f.name, prog_id=getattr(f, "prog_id", 0), handle=f.handle, prio=f.prio)
    if not is_ours(f.name) or not obs.prog_id:
        obs.error = f"filter {f.name or '?'} at shaperd's prio carries no readable program"
        return obs
    try:
        with ClassifierMaps.open(pins, device, obs.prog_id, key) as maps:
            obs.entries = maps.read()
    except bpf_maps.BpfMapError as e:
        obs.error = f"read classifier maps on {device}: {e}"
    return obs


# --------------------------------------------------------------- writes

_F_PUT = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE




def _info(prio: int = mapcls.PRIO_EGRESS_CLASSIFY) -> int:
    return (prio << 16) | socket.htons(ETH_P_ALL)


def ensure_clsact(ipr, ifindex: int) -> None:
    """Add a clsact qdisc unless one is there (it is shared: never replaced, never deleted)."""
    msg = _tcmsg(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, ifindex, CLSACT_HANDLE,
                 TC_H_CLSACT, kind="clsact")
    try:
        ipr.nlm_request_batch([msg])
    except NetlinkError as e:
        if e.code != errno_mod.EEXIST:
            raise


def attach(ipr, ifindex: int, prog_fd: int, name: str, prio: int = mapcls.PRIO_EGRESS_CLASSIFY,
           handle: int = mapcls.HANDLE_EGRESS_CLASSIFY) -> None:
    """Create or replace shaperd's own filter (prio/handle 0x7368, or the variant's) on clsact egress,
    direct-action."""
    opts = {"attrs": [["TCA_BPF_FD", prog_fd], ["TCA_BPF_NAME", name], ["TCA_BPF_FLAGS", 1]]}
    msg = _tcmsg(RTM_NEWTFILTER, _F_PUT, ifindex, handle, TC_H_CLSACT_EGRESS, _info(prio), "bpf", opts)
    ipr.nlm_request_batch([msg])


def detach(ipr, ifindex: int, prio: int = mapcls.PRIO_EGRESS_CLASSIFY,
           handle: int = mapcls.HANDLE_EGRESS_CLASSIFY) -> None:
    msg = _tcmsg(RTM_DELTFILTER, NLM_F_REQUEST | NLM_F_ACK, ifindex, handle, TC_H_CLSACT_EGRESS, _info(prio), "bpf")
    ipr.nlm_request_batch([msg])


def install(ipr, ifindex: int, want: MapClassifier, device: str = "", pins: bpf_pins.PinStore | None = None) -> int:
    """Fresh maps, filled, program loaded and attached, then (with ``pins``) pinned for ``device``,
    replacing its pins. Returns the number of bpf() map writes."""
    writes = 0
    with ClassifierMaps.create(want.key) as maps:
        for role in mapcls.roles(want.key):
            entries = want.entries.get(role, {})
            if entries:
                writes += maps.write(role, list(entries.items()), [])
        fd = load(maps, want.mark_mask, want.name, want.key)
        prio, handle, _ = mapcls.VARIANTS[want.key]
        try:
            ensure_clsact(ipr, ifindex)
            attach(ipr, ifindex, fd, want.name, prio, handle)
            if pins is not None:  # after the attach: old pins left by a crash here no longer match, so are replaced
                pins.pin(device, {PIN_PROG: fd, **maps.pin_files()})
        finally:
            os.close(fd)
    return writes


def is_classifier_op(op: Operation) -> bool:
    return isinstance(op, (mapcls.AttachMapClassifier, mapcls.UpdateClassifierMap, mapcls.DetachMapClassifier,
                           mapcls.UnpinMapClassifier))


def apply_ops(ipr, ops: list[Operation], pins: bpf_pins.PinStore | None = None) -> ApplyResult:
    """Execute classifier operations one by one; each failure is attributed to its operation."""
    result = ApplyResult()
    for op in ops:
        try:
            if isinstance(op, mapcls.AttachMapClassifier):
                install(ipr, op.ifindex, op.classifier, op.device, pins)
            elif isinstance(op, mapcls.UpdateClassifierMap):
                with ClassifierMaps.open(pins, op.device, op.prog_id, op.key) as maps:
                    maps.write(op.role, op.upserts, op.deletes)
            elif isinstance(op, mapcls.UnpinMapClassifier):
                if pins is None:
                    raise ValueError("no bpffs pin root in use")
                pins.remove(op.device)
            elif isinstance(op, mapcls.DetachMapClassifier):
                try:
                    detach(ipr, op.ifindex, op.prio, op.handle)
                except NetlinkError as e:
                    if e.code != errno_mod.ENOENT:
                        raise
            else:
                raise TypeError(f"not a classifier operation: {type(op).__name__}")
            result.applied.append(op)
        except NetlinkError as e:
            result.failed.append((op, op.error(os.strerror(e.code), e.code)))
        except (bpf.BpfError, OSError, ValueError) as e:
            result.failed.append((op, op.error(str(e), getattr(e, "errno", None))))
        except KernelError as e:
            result.failed.append((op, e))
    return result


ADOPT_PINS, ADOPT_ID = "pins", "id"


def probe_load(pin_root: str | None = None, read_only: bool = False) -> tuple[str, str]:
    """Without a probe device: create the maps, load the program and get them back as a later
    reconcile adopts them; attach nothing (clsact and a tc filter are NET_ADMIN's).

    Returns (how, reason): how is "pins" when pinning under ``pin_root`` and reopening the pins
    works (CAP_BPF and the directory's permissions), else "id" when reading the maps back by id
    works (BPF_*_GET_FD_BY_ID need CAP_SYS_ADMIN), else "" (a classifier that cannot be adopted
    would be reinstalled on every reconcile: the u32 path instead). reason says why not pins/id.
    ``read_only``: pin nothing; whether pinning would work is checked instead (bpf_pins.pinnable)."""
    want, _ = mapcls.build(0xFFFFFFFF, {}, (), {}, {})
    try:
        with ClassifierMaps.create() as maps:
            fd = load(maps, want.mark_mask, want.name)
            try:
                prog_id = bpf_maps.prog_info(fd).id
                pin_why = "no bpffs root configured"
                if pin_root:
                    ok, pin_why = (bpf_pins.pinnable(pin_root) if read_only
                                   else _probe_pins(pin_root, fd, maps, prog_id))
                    if ok:
                        return ADOPT_PINS, f"bpffs pins under {pin_root}" + (" (checked, none made)" if read_only
                                                                            else "")
                try:
                    with ClassifierMaps.adopt(prog_id):  # while fd holds the program alive
                        pass
                except (bpf.BpfError, OSError) as e:
                    return "", (f"bpffs pins: {pin_why}; read its maps back by id (BPF_*_GET_FD_BY_ID need "
                                f"CAP_SYS_ADMIN): {e}")
                return ADOPT_ID, f"by id (bpffs pins: {pin_why})"
            finally:
                os.close(fd)
    except (bpf.BpfError, OSError) as e:
        return "", str(e)


def _probe_pins(pin_root: str, prog_fd: int, maps: ClassifierMaps, prog_id: int) -> tuple[bool, str]:
    """Pin the probe's program and maps in a throwaway scope, adopt them from there, remove them."""
    try:
        store = bpf_pins.probe_store(pin_root)
    except ValueError as e:
        return False, str(e)
    try:
        store.pin("probe", {PIN_PROG: prog_fd, **maps.pin_files()})
        with ClassifierMaps.adopt_pinned(store, "probe", prog_id) as got:
            got.read()
    except (bpf.BpfError, OSError) as e:
        return False, str(e)
    finally:
        try:
            store.remove_scope()
        except bpf.BpfError:
            pass
    return True, "ok"


def probe(ipr, ifindex: int) -> tuple[bool, str]:
    """Can the map classifier run here? Creates its maps, loads and attaches it on ``ifindex`` (a probe
    device in a throwaway namespace), then detaches it. (ok, reason)."""
    want, _ = mapcls.build(0xFFFFFFFF, {}, (), {}, {})
    try:
        install(ipr, ifindex, want)
        detach(ipr, ifindex)
    except NetlinkError as e:
        return False, f"attach on clsact egress: {os.strerror(e.code)}"
    except (bpf.BpfError, OSError) as e:
        return False, str(e)
    return True, "ok"
