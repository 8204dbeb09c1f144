"""The EDT stamper: hand-built eBPF bytecode that gives each packet its departure time, and its four maps.

Owns the program's bytecode (no compiler on the node), the layout of its
maps, creating them (through kernel/bpf_maps.py) and loading the program
(kernel/bpf.py), and the reads and writes of a capped pod's key (its parent
and rate) that the edt backend's diff decides. It does NOT attach the filter
(kernel/tc.py does) or decide rates (backends/edt/controller.py does;
shaperd/backends/edt/loop.py writes them).

Per packet (direct-action cls_bpf on clsact egress, after the map
classifier, which wrote the tenant's class id 7368:<minor> into skb->priority,
or a capped pod's own class id):

1. key = minor of skb->priority if its major is 7368, else the default
   class minor (traffic of no tenant: the reserve entry);
2. parent = parents[key] (u32, ARRAY, written by the edt backend): a capped
   pod's key has its tenant's key (or the default key, for a pod of no
   tenant) as parent; 0 = none (a tenant's own key);
3. now = max(bpf_ktime_get_ns(), skb->tstamp) (TCP's own pacing stamp is kept
   as a lower bound; sch_fq and bpf_ktime_get_ns are both CLOCK_MONOTONIC);
4. the clock step of ``key``: ns_per_byte_q16 = rates[key] (u64, ARRAY,
   written by the controller for tenants, by the backend for pods):
   nanoseconds per byte in 16.16 fixed point, so the data path multiplies
   and shifts, never divides; 0 = no rate set: no step. Else, on the key's
   clock (clocks[key], u64 ns, ARRAY, written only here):
   next = max(now, last) + len * ns_per_byte_q16 >> 16, the classic EDT
   virtual clock (Cilium's edt_sched_departure, Carousel);
   - if the backlog ahead of the packet, max(now, last) - now, is beyond the
     horizon: drop (TC_ACT_SHOT), clock unchanged. The backlog, not the
     packet's own departure, so one large packet of a slow tenant always
     passes; the horizon bounds how long packets stamped at an old rate keep
     leaving after the controller lowered it;
   - else the clock moves with ONE atomic compare-and-exchange from the value
     read to ``next`` (BPF_ATOMIC | BPF_CMPXCHG, kernel >= 5.12). If another
     CPU moved it first, the packet queues behind that CPU's packet with an
     atomic fetch-and-add of its own delay (BPF_ADD | BPF_FETCH) and takes
     old + delay (undone with an atomic add of -delay if that is past the
     horizon). Shared per-key clock, not per-CPU: a tenant's rate is an
     aggregate over every CPU and TX queue, and per-CPU clocks would give each
     CPU the full rate. No lock: at most two atomic operations per step;
5. with a parent, the same step on the parent's clock and rate (the tenant
   paces the pod's packets with its own); beyond the horizon there, the key's
   own step is undone (an atomic add of -delay) and the packet dropped. The
   packet leaves at the LATER of the two departures: the pod's cap and the
   tenant's rate both hold. A key with a parent but no rate of its own is
   paced by the parent alone (a pod never leaves its tenant's pacing);
6. skb->tstamp = that departure (unchanged when no step ran); stats[key] +=
   (len, 1), and stats[parent] too, so the controller's per-tenant counters
   still see the whole tenant (PERCPU_HASH, no atomics: the entry is created
   by the program itself on first use); TC_ACT_OK. A drop counts one drop
   under both.

The rates and clocks are separate maps so the controller's writes (a whole
value at a time) never reset a clock. Keys are class minors (0..0xFFFF), so
rates, clocks and parents are 64 Ki-entry arrays (512, 512 and 256 KiB) and
need no per-tenant setup. A pod key's parent is written before its rate and
cleared after it: a key with a parent is a capped pod's, which is how the
backend finds leftovers (``read_parents``).

Finding the maps again (the rate controller, after a restart): through the
bpffs pins ``<root>/shaperd/<scope>/edt-stamper/<device>/{prog,map_rates,
map_clocks,map_stats,map_parents}`` when the probe found pins usable (CAP_BPF and the
directory's permissions suffice), else by program id (BPF_*_GET_FD_BY_ID:
CAP_SYS_ADMIN). The pins are written when the program is loaded, before the
attach: a failed attach leaves pins of a program that is not attached, which
``adopt_pinned`` refuses (its id is not the filter's) and the next SetStamper
replaces. Which pins are stale is the edt backend's decision (backends/edt/diff.py).
"""

from __future__ import annotations

import array
import os
import struct
import sys
from dataclasses import dataclass

from shaperd.kernel import bpf, bpf_maps, bpf_pins
from shaperd.core.protocol import ApplyResult
from shaperd.backends.edt import ops as edt
from shaperd.backends.edt.objects import DEFAULT_KEY, KEY_SPACE, STATS_MAX_ENTRIES, Stats, stamper_name

# struct __sk_buff offsets, from the one ctypes layout (kernel/bpf_maps.py).
OFF_LEN = bpf_maps.SkBuff.len.offset
OFF_PRIORITY = bpf_maps.SkBuff.priority.offset
OFF_TSTAMP = bpf_maps.SkBuff.tstamp.offset

TC_ACT_OK, TC_ACT_SHOT = 0, 2
_FN_MAP_LOOKUP, _FN_MAP_UPDATE, _FN_KTIME_GET_NS = 1, 2, 5
_BPF_NOEXIST = 1
HANDLE_MAJOR_CLASS = 0x7368
STATS_VALUE = struct.Struct("<QQQ")  # bytes, packets, dropped packets (one per CPU)
STAMPER_PINS = "edt-stamper"  # the PinStore sub-scope of the stampers' pins (a sibling of the backends' parts)
PIN_PROG = bpf_pins.PIN_PROG
MAP_NAMES = {"rates": "shpe_rates", "clocks": "shpe_clocks", "stats": "shpe_stats", "parents": "shpe_parents"}
PIN_MAPS = {role: bpf_pins.pin_map(role) for role in MAP_NAMES}

# opcodes (uapi linux/bpf.h, linux/bpf_common.h)
_LDX_W, _LDX_DW, _STX_W, _STX_DW, _ST_DW = 0x61, 0x79, 0x63, 0x7B, 0x7A
_ATOMIC_DW = 0xDB  # BPF_STX | BPF_DW | BPF_ATOMIC
_BPF_ADD, _BPF_FETCH, _BPF_CMPXCHG = 0x00, 0x01, 0xF1
_MOV64_X, _MOV64_K, _MOV32_K = 0xBF, 0xB7, 0xB4
_ADD64_X, _ADD64_K, _SUB64_X, _MUL64_X, _RSH64_K, _NEG64 = 0x0F, 0x07, 0x1F, 0x2F, 0x77, 0x87
_AND32_K, _RSH32_K = 0x54, 0x74
_JA, _JEQ_K, _JEQ_X, _JNE_K32, _JGE_X, _JGT_X, _JNE_K = 0x05, 0x15, 0x1D, 0x56, 0x3D, 0x2D, 0x55
_JGT_K, _JSGT_K = 0x25, 0x65
_CALL, _EXIT = 0x85, 0x95
# The program's stack: the key and its parent (u32 each), the key's own departure, the parent's delay
# across a helper call, a scratch u64 (the undo of a key that had no step of its own), and a zeroed stats
# value (3 x u64) for a key's first packet.
_FP_KEY, _FP_PARENT, _FP_DEPART, _FP_SPILL, _FP_SCRATCH, _FP_ZERO = -4, -8, -16, -24, -32, -56


class _Asm:
    """A tiny assembler: instructions with symbolic jump targets, resolved at the end."""

    def __init__(self):
        self.code: list[tuple[int, int, int, int | str, int] | bytes] = []
        self.labels: dict[str, int] = {}

    def __call__(self, op: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> None:
        self.code.append((op, dst, src, off, imm))

    def raw(self, two_slots: bytes) -> None:
        self.code.append(two_slots)

    def label(self, name: str) -> None:
        self.labels[name] = self._pc()

    def _pc(self) -> int:
        return sum(len(c) // 8 if isinstance(c, bytes) else 1 for c in self.code)

    def assemble(self) -> bytes:
        out, pc = [], 0
        for c in self.code:
            if isinstance(c, bytes):
                out.append(c)
                pc += len(c) // 8
                continue
            op, dst, src, off, imm = c
            if isinstance(off, str):
                off = self.labels[off] - pc - 1
            out.append(struct.pack("<BBhI", op, (src << 4) | dst, off, imm & 0xFFFFFFFF))
            pc += 1
        return b"".join(out)


def stamper(rates_fd: int, clocks_fd: int, stats_fd: int, horizon_ns: int, parents_fd: int) -> bytes:
    """The program's bytecode, referencing the four maps by fd (see the module docstring)."""
    if not 0 < horizon_ns < 2**31:
        raise ValueError(f"horizon {horizon_ns} ns must be in 1..2^31-1 (it is a 32-bit immediate)")
    a = _Asm()
    a(_MOV64_X, 6, 1)  # r6 = skb
    # key = (priority >> 16 == 7368) ? priority & 0xffff : DEFAULT_KEY, at fp-4
    a(_LDX_W, 2, 6, OFF_PRIORITY)
    a(_MOV64_X, 3, 2)
    a(_RSH32_K, 3, 0, 0, 16)
    a(_JNE_K32, 3, 0, "default", HANDLE_MAJOR_CLASS)
    a(_AND32_K, 2, 0, 0, 0xFFFF)
    a(_JA, 0, 0, "have_key")
    a.label("default")
    a(_MOV32_K, 2, 0, 0, DEFAULT_KEY)
    a.label("have_key")
    a(_STX_W, 10, 2, _FP_KEY)
    # parent = parents[key] (a capped pod's tenant key; 0: none), at fp-8
    a.raw(bpf_maps.ld_map_fd(1, parents_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, _FP_KEY)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_MOV32_K, 1, 0, 0, 0)
    a(_JEQ_K, 0, 0, "have_parent", 0)
    a(_LDX_W, 1, 0, 0)
    a.label("have_parent")
    a(_STX_W, 10, 1, _FP_PARENT)
    # r9 = now = max(ktime, skb->tstamp)
    a(_CALL, 0, 0, 0, _FN_KTIME_GET_NS)
    a(_LDX_DW, 9, 6, OFF_TSTAMP)
    a(_JGT_X, 9, 0, "now_ok")
    a(_MOV64_X, 9, 0)
    a.label("now_ok")
    # The key's own clock step (r7 = &clocks[key], r8 = its delay: callee-saved, they survive the parent's
    # step for its undo). No rate of its own: no departure of its own (0), and an undo that changes nothing.
    _emit_clock_step(a, "own", _FP_KEY, rates_fd, clocks_fd, ptr=7, delay=8, spill=None, horizon_ns=horizon_ns,
                     no_rate="own_unpaced", drop="drop", done="own_done")
    a.label("own_unpaced")
    # Nothing to undo: the undo below adds -0 to a scratch stack slot. A pointer in r7 on every path, and no
    # branch on r8: without CAP_PERFMON the verifier also walks mispredicted branches (Spectre v1), where an
    # r7 left unset would be read (6.1 refuses the program: "R7 !read_ok").
    a(_MOV64_K, 8, 0, 0, 0)
    a(_ST_DW, 10, 0, _FP_SCRATCH, 0)
    a(_MOV64_X, 7, 10)
    a(_ADD64_K, 7, 0, 0, _FP_SCRATCH)
    a(_MOV64_K, 2, 0, 0, 0)
    a.label("own_done")
    a(_STX_DW, 10, 2, _FP_DEPART)
    a(_LDX_W, 1, 10, _FP_PARENT)
    a(_JEQ_K, 1, 0, "own_only", 0)
    # The parent's step: the same clock step on the tenant's clock and rate (its delay kept on the stack
    # across its clock lookup); beyond the horizon there, the key's own step is undone and the packet dropped.
    _emit_clock_step(a, "parent", _FP_PARENT, rates_fd, clocks_fd, ptr=5, delay=4, spill=_FP_SPILL,
                     horizon_ns=horizon_ns, no_rate="own_only", drop="undo_own", done="later")
    a.label("later")  # tstamp = the later of the two departures
    a(_LDX_DW, 1, 10, _FP_DEPART)
    a(_JGE_X, 2, 1, "stamp")
    a(_MOV64_X, 2, 1)
    a(_JA, 0, 0, "stamp")
    a.label("own_only")
    a(_LDX_DW, 2, 10, _FP_DEPART)
    a(_JEQ_K, 2, 0, "count_ok", 0)  # neither clock paces it: pass unstamped
    a(_JA, 0, 0, "stamp")
    a.label("undo_own")
    a(_MOV64_X, 3, 8)
    a(_NEG64, 3)
    a(_ATOMIC_DW, 7, 3, 0, _BPF_ADD)
    a(_JA, 0, 0, "drop")
    a.label("stamp")
    a(_STX_DW, 6, 2, OFF_TSTAMP)
    a(_JA, 0, 0, "count_ok")
    a.label("drop")
    _emit_counts(a, stats_fd, "drop")
    a(_MOV64_K, 0, 0, 0, TC_ACT_SHOT)
    a(_EXIT)
    a.label("count_ok")
    _emit_counts(a, stats_fd, "ok")
    a(_MOV64_K, 0, 0, 0, TC_ACT_OK)
    a(_EXIT)
    return a.assemble()


def _emit_clock_step(a: _Asm, p: str, key_off: int, rates_fd: int, clocks_fd: int, ptr: int, delay: int,
                     spill: int | None, horizon_ns: int, no_rate: str, drop: str, done: str) -> None:
    """One EDT clock step for the key at ``fp+key_off``: departure in r2 at ``done``.

    delay = len * rates[key] >> 16 (in register ``delay``; spilled to ``fp+spill`` across the clocks lookup
    when ``delay`` is not callee-saved); ``ptr`` = &clocks[key]; next = max(now, last) + delay, moved by one
    cmpxchg, else queued behind the other CPU's packet by fetch-and-add. The backlog ahead of the packet
    beyond the horizon goes to ``drop`` with the clock as it was (the fetch-and-add undone). No rate set
    (or no entry): ``no_rate``, nothing changed. r9 = now, r6 = skb; clobbers r0-r5."""
    a.raw(bpf_maps.ld_map_fd(1, rates_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, key_off)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JEQ_K, 0, 0, no_rate, 0)
    a(_LDX_DW, 1, 0, 0)
    a(_JEQ_K, 1, 0, no_rate, 0)
    a(_LDX_W, delay, 6, OFF_LEN)
    a(_MUL64_X, delay, 1)
    a(_RSH64_K, delay, 0, 0, 16)
    if spill is not None:
        a(_STX_DW, 10, delay, spill)
    a.raw(bpf_maps.ld_map_fd(1, clocks_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, key_off)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JEQ_K, 0, 0, no_rate, 0)
    a(_MOV64_X, ptr, 0)
    if spill is not None:
        a(_LDX_DW, delay, 10, spill)
    # r1 = last; r2 = max(now, last)
    a(_LDX_DW, 1, ptr, 0)
    a(_MOV64_X, 2, 1)
    a(_JGE_X, 2, 9, f"{p}_base_ok")
    a(_MOV64_X, 2, 9)
    a.label(f"{p}_base_ok")
    # backlog ahead of this packet (base - now) beyond the horizon: drop, clock untouched
    a(_MOV64_X, 3, 2)
    a(_SUB64_X, 3, 9)
    a(_JGT_K, 3, 0, drop, horizon_ns)
    a(_ADD64_X, 2, delay)
    # r0 = cmpxchg(clock, expected r1, new r2); won the race if r0 == r1
    a(_MOV64_X, 0, 1)
    a(_ATOMIC_DW, ptr, 2, 0, _BPF_CMPXCHG)
    a(_JEQ_X, 0, 1, done)
    # lost it: queue behind the other CPU's packet; r3 = old, r2 = old + delay
    a(_MOV64_X, 3, delay)
    a(_ATOMIC_DW, ptr, 3, 0, _BPF_ADD | _BPF_FETCH)
    a(_MOV64_X, 2, 3)
    a(_ADD64_X, 2, delay)
    a(_SUB64_X, 3, 9)  # backlog ahead of it: old - now, signed (the clock may lag now)
    a(_JSGT_K, 3, 0, f"{p}_undo", horizon_ns)
    a(_JA, 0, 0, done)
    a.label(f"{p}_undo")
    a(_MOV64_X, 3, delay)
    a(_NEG64, 3)
    a(_ATOMIC_DW, ptr, 3, 0, _BPF_ADD)
    a(_JA, 0, 0, drop)


def _emit_counts(a: _Asm, stats_fd: int, kind: str) -> None:
    """The packet counted under its key, and under its parent too when it has one (the tenant's total)."""
    _emit_count(a, stats_fd, kind, _FP_KEY, "key")
    a(_LDX_W, 1, 10, _FP_PARENT)
    a(_JEQ_K, 1, 0, f"counted_{kind}_parent", 0)
    _emit_count(a, stats_fd, kind, _FP_PARENT, "parent")


def _emit_count(a: _Asm, stats_fd: int, kind: str, key_off: int, who: str) -> None:
    """stats[fp+key_off]: create the per-CPU entry on first use, then add (len, 1), or one drop."""
    done = f"counted_{kind}_{who}"
    have = f"have_stats_{kind}_{who}"
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, key_off)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JNE_K, 0, 0, have, 0)
    for off in (_FP_ZERO, _FP_ZERO + 8, _FP_ZERO + 16):
        a(_ST_DW, 10, 0, off, 0)
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, key_off)
    a(_MOV64_X, 3, 10)
    a(_ADD64_K, 3, 0, 0, _FP_ZERO)
    a(_MOV64_K, 4, 0, 0, _BPF_NOEXIST)
    a(_CALL, 0, 0, 0, _FN_MAP_UPDATE)
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, key_off)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JEQ_K, 0, 0, done, 0)
    a.label(have)
    if kind == "ok":
        a(_LDX_W, 1, 6, OFF_LEN)
        a(_LDX_DW, 2, 0, 0)
        a(_ADD64_X, 2, 1)
        a(_STX_DW, 0, 2, 0)
        a(_LDX_DW, 2, 0, 8)
        a(_ADD64_K, 2, 0, 0, 1)
        a(_STX_DW, 0, 2, 8)
    else:
        a(_LDX_DW, 2, 0, 16)
        a(_ADD64_K, 2, 0, 0, 1)
        a(_STX_DW, 0, 2, 16)
    a.label(done)


# ------------------------------------------------------------------ objects


@dataclass
class StamperMaps:
    """The four maps of one stamper (own their fds)."""

    rates: bpf_maps.BpfMap
    clocks: bpf_maps.BpfMap
    stats: bpf_maps.BpfMap
    parents: bpf_maps.BpfMap

    @classmethod
    def of(cls, got: dict[str, bpf_maps.BpfMap]) -> StamperMaps:
        return cls(**{role: got[role] for role in MAP_NAMES})

    def _all(self) -> tuple[bpf_maps.BpfMap, ...]:
        return tuple(getattr(self, role) for role in MAP_NAMES)

    def close(self) -> None:
        for m in self._all():
            m.close()

    def pin_files(self) -> dict[str, int]:
        return {PIN_MAPS[role]: getattr(self, role).fd for role in MAP_NAMES}

    def __enter__(self) -> StamperMaps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the controller's side
    def write_rates(self, ns_per_byte_q16: dict[int, int]) -> int:
        """rates[key] = value for each key; returns the number of bpf() calls."""
        return self.rates.update_batch({_key(k): struct.pack("<Q", v) for k, v in sorted(ns_per_byte_q16.items())})

    def read_rates(self, keys) -> dict[int, int]:
        out = {}
        for k in keys:
            v = self.rates.lookup(_key(k))
            out[k] = struct.unpack("<Q", v)[0] if v is not None else 0
        return out

    def read_set_rates(self) -> dict[int, int]:
        """Every key with a rate set (non-zero), in one batched read of the array (status without a tenants file)."""
        out = {}
        for k, v in self.rates.items().items():
            q16 = struct.unpack("<Q", v)[0]
            if q16:
                out[struct.unpack("<I", k)[0]] = q16
        return out

    def read_stats(self) -> dict[int, Stats]:
        """key -> totals over every CPU (bytes, packets, dropped packets) since the program was attached."""
        out = {}
        slot = (STATS_VALUE.size + 7) // 8 * 8
        for k, v in self.stats.items().items():
            b = p = d = 0
            for cpu in range(len(v) // slot):
                cb, cp, cd = STATS_VALUE.unpack_from(v, cpu * slot)
                b, p, d = b + cb, p + cp, d + cd
            out[struct.unpack("<I", k)[0]] = Stats(b, p, d)
        return out

    def read_clocks(self, keys) -> dict[int, int]:
        """key -> the tenant's next departure time (ns, CLOCK_MONOTONIC): ahead of now = backlogged."""
        return {k: self.read_clock(k) for k in keys}

    def read_clock(self, key: int) -> int:
        v = self.clocks.lookup(_key(key))
        return struct.unpack("<Q", v)[0] if v is not None else 0

    def set_clock(self, key: int, value_ns: int) -> None:
        """Tests only (and a pod key's removal, which zeroes it): the data path owns the clocks."""
        self.clocks.update(_key(key), struct.pack("<Q", value_ns))

    # -- the backend's side: capped pods' keys (their parent and their static rate)
    def read_parents(self) -> dict[int, int]:
        """key -> parent key of every key with a parent (a capped pod's), in one batched read of the array."""
        keys, values = self.parents.items_raw()  # 64 Ki u32s: scanned as arrays, not 64 Ki Python entries
        ks, vs = array.array("I", keys), array.array("I", values)
        if sys.byteorder != "little":  # the map holds them as struct.pack("<I") wrote them
            ks.byteswap()
            vs.byteswap()
        return {k: v for k, v in zip(ks, vs) if v}

    def write_parents(self, parents: dict[int, int]) -> int:
        """parents[key] = parent for each key (0 clears); returns the number of bpf() calls."""
        return self.parents.update_batch({_key(k): struct.pack("<I", v) for k, v in sorted(parents.items())})

    def clear_key(self, key: int) -> int:
        """Forget a pod key: its rate, clock and counters, then its parent (the marker observe looks for) last,
        so a failure part-way leaves the key found and cleared again. Returns the number of bpf() calls."""
        calls = self.write_rates({key: 0})
        self.set_clock(key, 0)
        self.stats.delete(_key(key))
        return calls + 2 + self.write_parents({key: 0})


def _key(k: int) -> bytes:
    return struct.pack("<I", k)


_MAP_SHAPES = {  # role -> (type, value size, entries)
    "rates": (bpf_maps.MAP_ARRAY, 8, KEY_SPACE),
    "clocks": (bpf_maps.MAP_ARRAY, 8, KEY_SPACE),
    "stats": (bpf_maps.MAP_PERCPU_HASH, STATS_VALUE.size, STATS_MAX_ENTRIES),
    "parents": (bpf_maps.MAP_ARRAY, 4, KEY_SPACE),
}


def create_maps(device: str = "") -> StamperMaps:
    """Fresh maps for one stamper. Names carry the role, so ``bpftool map`` shows what each is."""
    made: dict[str, bpf_maps.BpfMap] = {}
    try:
        for role, (t, v, n) in _MAP_SHAPES.items():
            made[role] = bpf_maps.create_map(t, 4, v, n, MAP_NAMES[role])
    except BaseException:
        for m in made.values():
            m.close()
        raise
    return StamperMaps.of(made)


def adopt_maps(prog_id: int) -> StamperMaps:
    """The maps of an attached stamper, found from its program id (after an agent restart; CAP_SYS_ADMIN)."""
    return StamperMaps.of(bpf_maps.maps_of_prog(prog_id, MAP_NAMES, "edt stamper maps"))


def load(maps: StamperMaps, horizon_ns: int) -> int:
    """Load the stamper against ``maps``; returns the program fd (the caller closes it once attached)."""
    name = stamper_name(horizon_ns)
    code = stamper(maps.rates.fd, maps.clocks.fd, maps.stats.fd, horizon_ns, parents_fd=maps.parents.fd)
    return bpf.load_sched_cls(code, name)


def load_fresh(horizon_ns: int, initial_q16: dict[int, int], pins: bpf_pins.PinStore | None = None,
               device: str = "", initial_parents: dict[int, int] | None = None) -> int:
    """New maps with the first rates (and the capped pods' parents) written, and the stamper loaded against
    them; returns the program fd.

    With ``pins`` (the "edt-stamper" part of the scope), the program and its
    maps are pinned as ``device``'s entry, replacing what it held (PinError if
    that fails: the program is then not attached). The map fds are closed
    before returning: the loaded program holds the maps, and the controller
    finds them again from the attached filter (``open_for_device``).
    """
    with create_maps() as maps:
        if initial_q16:
            maps.write_rates(initial_q16)
        if initial_parents:
            maps.write_parents(initial_parents)
        fd = load(maps, horizon_ns)
        if pins is not None:
            try:
                pins.pin(device, {PIN_PROG: fd, **maps.pin_files()})
            except BaseException:
                os.close(fd)
                raise
        return fd


def probe_load(pin_root: str | None, horizon_ns: int = 100_000_000, read_only: bool = False) -> tuple[bool, str]:
    """Without a probe device (no CAP_SYS_ADMIN): can this process load the stamper and get its maps back
    after a restart? Creates its maps, loads it (the verifier's rules for this process's capabilities), pins
    it in a throwaway scope under ``pin_root``, adopts it from there, removes the scope. Attaches nothing.
    ``read_only``: loads it, pins nothing, and checks whether pinning would work (bpf_pins.pinnable).
    (ok, what was shown or why not)."""
    if not pin_root:
        return False, "no bpffs root configured (by id needs CAP_SYS_ADMIN)"
    if read_only:
        try:
            os.close(load_fresh(horizon_ns, {}))
        except (bpf.BpfError, OSError) as e:
            return False, f"load the edt stamper: {e}"
        ok, why = bpf_pins.pinnable(pin_root)
        if not ok:
            return False, f"edt stamper pins: {why}"
        return True, (f"the stamper loads and its maps can be adopted through bpffs pins under {pin_root} "
                      "(checked, none made)")
    try:
        store = bpf_pins.probe_store(pin_root)
    except ValueError as e:
        return False, str(e)
    try:
        fd = load_fresh(horizon_ns, {}, store, "probe")
        try:
            with adopt_pinned(store, "probe", bpf_maps.prog_info(fd).id) as maps:
                maps.read_rates([DEFAULT_KEY])
        finally:
            os.close(fd)
    except (bpf.BpfError, OSError) as e:
        return False, f"load the edt stamper: {e}"
    finally:
        try:
            store.remove_scope()
        except bpf.BpfError:
            pass
    return True, f"the stamper loads and its maps are adopted through bpffs pins under {pin_root}"


def adopt_pinned(pins: bpf_pins.PinStore, device: str, prog_id: int) -> StamperMaps:
    """The maps pinned for ``device``, if its pinned program is the attached ``prog_id`` and every pinned map
    is one of that program's, by name and id (PinError naming the device and the reason otherwise)."""
    return StamperMaps.of(bpf_pins.adopt_pinned(pins, device, prog_id, MAP_NAMES, "edt stamper maps"))


def open_for_device(reader, ifindex: int, device: str, name: str,
                    pins: bpf_pins.PinStore | None = None) -> StamperMaps:
    """The maps of the stamper ``name`` attached on ``device``'s clsact egress (filter dump -> program id ->
    maps): through ``pins`` (the "edt-stamper" part of the scope) when given, else by id (CAP_SYS_ADMIN)."""
    from shaperd.backends.edt.objects import PRIO_STAMPER

    for f in reader.filters(ifindex, 0xFFFFFFF3, device):
        if f.kind == "bpf" and f.prio == PRIO_STAMPER and f.name == name and f.prog_id:
            return adopt_pinned(pins, device, f.prog_id) if pins is not None else adopt_maps(f.prog_id)
    raise bpf_maps.BpfMapError(f"find edt stamper {name} on {device}: not attached (clsact egress prio {PRIO_STAMPER})")


def apply_unpins(ops, pins: bpf_pins.PinStore | None):
    """Execute edt.UnpinStamper operations: remove each device's stamper pins (never outside ``pins``)."""
    result = ApplyResult()
    for op in ops:
        try:
            if pins is None:
                raise bpf_pins.PinError(f"remove edt stamper pins of {op.device}: no bpffs pin root in use")
            pins.remove(op.device)
            result.applied.append(op)
        except bpf_pins.PinError as e:
            result.failed.append((op, op.error(str(e), e.errno)))
    return result


def open_attached(device: str, prog_id: int, pins: bpf_pins.PinStore | None = None) -> StamperMaps:
    """The maps of the stamper attached on ``device`` as program ``prog_id``: through ``pins`` when given, else
    by id (CAP_SYS_ADMIN), as the rate controller opens them."""
    return adopt_pinned(pins, device, prog_id) if pins is not None else adopt_maps(prog_id)


def read_pod_entries(maps: StamperMaps) -> dict[int, tuple[int, int]]:
    """key -> (parent, rate Q16) of every key with a parent: the capped pods' entries as the stamper holds them."""
    parents = maps.read_parents()
    rates = maps.read_rates(sorted(parents))
    return {k: (p, rates[k]) for k, p in parents.items()}


def apply_pod_ops(ops, pins: bpf_pins.PinStore | None = None, open_maps=open_attached) -> ApplyResult:
    """Execute edt.SetPodKey / edt.ClearPodKey: each device's attached stamper opened once (``open_maps``),
    each operation's failure attributed to it. SetPodKey writes the parent before the rate."""
    result = ApplyResult()
    opened: dict[tuple[str, int], StamperMaps | Exception] = {}
    try:
        for op in ops:
            where = (op.device, op.prog_id)
            if where not in opened:
                try:
                    opened[where] = open_maps(op.device, op.prog_id, pins)
                except (bpf.BpfError, OSError) as e:
                    opened[where] = e
            maps = opened[where]
            try:
                if isinstance(maps, Exception):
                    raise maps
                if isinstance(op, edt.SetPodKey):
                    if op.parent is not None:
                        maps.write_parents({op.key: op.parent})
                    if op.ns_per_byte_q16 is not None:
                        maps.write_rates({op.key: op.ns_per_byte_q16})
                elif isinstance(op, edt.ClearPodKey):
                    maps.clear_key(op.key)
                else:
                    raise TypeError(f"not an edt pod key operation: {type(op).__name__}")
                result.applied.append(op)
            except (bpf.BpfError, OSError) as e:
                result.failed.append((op, op.error(str(e), getattr(e, "errno", None) or None)))
    finally:
        for maps in opened.values():
            if isinstance(maps, StamperMaps):
                maps.close()
    return result
