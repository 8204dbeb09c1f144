"""The EDT stamper: hand-built eBPF bytecode that gives each packet its departure time, and its three maps.

Owns the program's bytecode (no compiler on the node), the layout of its
maps, creating them (through kernel/bpf_maps.py) and loading the program
(kernel/bpf.py). It does NOT attach the filter (kernel/tc.py does) or decide
rates (backends/edt/controller.py does; shaperd/backends/edt/loop.py writes them).

Per packet (direct-action cls_bpf on clsact egress, after the map
classifier, which wrote the tenant's class id 7368:<minor> into skb->priority):

1. key = minor of skb->priority if its major is 7368, else the default
   class minor (traffic of no tenant: the reserve entry);
2. ns_per_byte_q16 = rates[key] (u64, ARRAY, written by the controller):
   nanoseconds per byte in 16.16 fixed point, so the data path multiplies
   and shifts, never divides; 0 = no rate set: pass unstamped;
3. now = max(bpf_ktime_get_ns(), skb->tstamp) (TCP's own pacing stamp is kept
   as a lower bound; sch_fq and bpf_ktime_get_ns are both CLOCK_MONOTONIC);
4. the tenant's clock (clocks[key], u64 ns, ARRAY, written only here):
   next = max(now, last) + len * ns_per_byte_q16 >> 16, the classic EDT
   virtual clock (Cilium's edt_sched_departure, Carousel);
5. if the backlog ahead of the packet, max(now, last) - now, is beyond the
   horizon: drop (TC_ACT_SHOT), clock unchanged. The backlog, not the
   packet's own departure, so one large packet of a slow tenant always
   passes; the horizon bounds how long packets stamped at an old rate keep
   leaving after the controller lowered it;
6. else the clock moves with ONE atomic compare-and-exchange from the value
   read to ``next`` (BPF_ATOMIC | BPF_CMPXCHG, kernel >= 5.12). If another
   CPU moved it first, the packet queues behind that CPU's packet with an
   atomic fetch-and-add of its own delay (BPF_ADD | BPF_FETCH) and takes
   old + delay (undone with an atomic add of -delay if that is past the
   horizon). Shared per-tenant clock, not per-CPU: a tenant's rate is an
   aggregate over every CPU and TX queue, and per-CPU clocks would give each
   CPU the full rate. No lock: at most two atomic operations per packet;
7. skb->tstamp = next; stats[key] += (len, 1) (PERCPU_HASH, no atomics:
   the entry is created by the program itself on first use); TC_ACT_OK.

The rates and clocks are separate maps so the controller's writes (a whole
value at a time) never reset a clock. Keys are class minors (0..0xFFFF), so
both are 64 Ki-entry arrays (512 KiB each) and need no per-tenant setup.

Finding the maps again (the rate controller, after a restart): through the
bpffs pins ``<root>/shaperd/<scope>/edt-stamper/<device>/{prog,map_rates,
map_clocks,map_stats}`` when the probe found pins usable (CAP_BPF and the
directory's permissions suffice), else by program id (BPF_*_GET_FD_BY_ID:
CAP_SYS_ADMIN). The pins are written when the program is loaded, before the
attach: a failed attach leaves pins of a program that is not attached, which
``adopt_pinned`` refuses (its id is not the filter's) and the next SetStamper
replaces. Which pins are stale is the edt backend's decision (backends/edt/diff.py).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from shaperd.kernel import bpf, bpf_maps, bpf_pins
from shaperd.core.protocol import ApplyResult
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
MAP_NAMES = {"rates": "shpe_rates", "clocks": "shpe_clocks", "stats": "shpe_stats"}
PIN_MAPS = {role: bpf_pins.pin_map(role) for role in MAP_NAMES}

# opcodes (uapi linux/bpf.h, linux/bpf_common.h)
_LDX_W, _LDX_DW, _STX_W, _STX_DW, _ST_DW = 0x61, 0x79, 0x63, 0x7B, 0x7A
_ATOMIC_DW = 0xDB  # BPF_STX | BPF_DW | BPF_ATOMIC
_BPF_ADD, _BPF_FETCH, _BPF_CMPXCHG = 0x00, 0x01, 0xF1
_MOV64_X, _MOV64_K, _MOV32_K = 0xBF, 0xB7, 0xB4
_ADD64_X, _ADD64_K, _SUB64_X, _MUL64_X, _RSH64_K, _NEG64 = 0x0F, 0x07, 0x1F, 0x2F, 0x77, 0x87
_AND32_K, _RSH32_K = 0x54, 0x74
_JA, _JEQ_K, _JEQ_X, _JNE_K32, _JGE_X, _JGT_X, _JNE_K, _JSGT_X = 0x05, 0x15, 0x1D, 0x56, 0x3D, 0x2D, 0x55, 0x6D
_CALL, _EXIT = 0x85, 0x95


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


def stamper(rates_fd: int, clocks_fd: int, stats_fd: int, horizon_ns: int) -> bytes:
    """The program's bytecode, referencing the three maps by fd (see the module docstring)."""
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
    a(_STX_W, 10, 2, -4)
    # r7 = rates[key] (ns per byte, Q16); none: count and pass
    a.raw(bpf_maps.ld_map_fd(1, rates_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, -4)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JEQ_K, 0, 0, "count_ok", 0)
    a(_LDX_DW, 7, 0, 0)
    a(_JEQ_K, 7, 0, "count_ok", 0)
    # r8 = delay = len * q16 >> 16
    a(_LDX_W, 8, 6, OFF_LEN)
    a(_MUL64_X, 8, 7)
    a(_RSH64_K, 8, 0, 0, 16)
    # r9 = now = max(ktime, skb->tstamp)
    a(_CALL, 0, 0, 0, _FN_KTIME_GET_NS)
    a(_LDX_DW, 9, 6, OFF_TSTAMP)
    a(_JGT_X, 9, 0, "now_ok")
    a(_MOV64_X, 9, 0)
    a.label("now_ok")
    # r7 = &clocks[key]
    a.raw(bpf_maps.ld_map_fd(1, clocks_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, -4)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JEQ_K, 0, 0, "count_ok", 0)
    a(_MOV64_X, 7, 0)
    # r1 = last; r2 = next = max(now, last) + delay
    a(_LDX_DW, 1, 7, 0)
    a(_MOV64_X, 2, 1)
    a(_JGE_X, 2, 9, "base_ok")
    a(_MOV64_X, 2, 9)
    a.label("base_ok")
    # backlog ahead of this packet (base - now) beyond the horizon: drop, clock untouched
    a(_MOV64_X, 3, 2)
    a(_SUB64_X, 3, 9)
    a(_MOV64_K, 4, 0, 0, horizon_ns)
    a(_JGT_X, 3, 4, "drop")
    a(_ADD64_X, 2, 8)
    # r0 = cmpxchg(clock, expected r1, new r2); won the race if r0 == r1
    a(_MOV64_X, 0, 1)
    a(_ATOMIC_DW, 7, 2, 0, _BPF_CMPXCHG)
    a(_JEQ_X, 0, 1, "stamp")
    # lost it: queue behind the other CPU's packet; r3 = old, r2 = old + delay
    a(_MOV64_X, 3, 8)
    a(_ATOMIC_DW, 7, 3, 0, _BPF_ADD | _BPF_FETCH)
    a(_MOV64_X, 2, 3)
    a(_ADD64_X, 2, 8)
    a(_SUB64_X, 3, 9)  # backlog ahead of it: old - now, signed (the clock may lag now)
    a(_MOV64_K, 4, 0, 0, horizon_ns)
    a(_JSGT_X, 3, 4, "undo")
    a.label("stamp")
    a(_STX_DW, 6, 2, OFF_TSTAMP)
    a(_JA, 0, 0, "count_ok")
    a.label("undo")
    a(_MOV64_X, 3, 8)
    a(_NEG64, 3)
    a(_ATOMIC_DW, 7, 3, 0, _BPF_ADD)
    a.label("drop")
    _emit_count(a, stats_fd, "drop")
    a(_MOV64_K, 0, 0, 0, TC_ACT_SHOT)
    a(_EXIT)
    a.label("count_ok")
    _emit_count(a, stats_fd, "ok")
    a(_MOV64_K, 0, 0, 0, TC_ACT_OK)
    a(_EXIT)
    return a.assemble()


def _emit_count(a: _Asm, stats_fd: int, kind: str) -> None:
    """stats[key]: create the per-CPU entry on first use, then add (len, 1), or one drop."""
    done = f"counted_{kind}"
    have = f"have_stats_{kind}"
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, -4)
    a(_CALL, 0, 0, 0, _FN_MAP_LOOKUP)
    a(_JNE_K, 0, 0, have, 0)
    for off in (-32, -24, -16):
        a(_ST_DW, 10, 0, off, 0)
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, -4)
    a(_MOV64_X, 3, 10)
    a(_ADD64_K, 3, 0, 0, -32)
    a(_MOV64_K, 4, 0, 0, _BPF_NOEXIST)
    a(_CALL, 0, 0, 0, _FN_MAP_UPDATE)
    a.raw(bpf_maps.ld_map_fd(1, stats_fd))
    a(_MOV64_X, 2, 10)
    a(_ADD64_K, 2, 0, 0, -4)
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
    """The three maps of one stamper (own their fds)."""

    rates: bpf_maps.BpfMap
    clocks: bpf_maps.BpfMap
    stats: bpf_maps.BpfMap

    def close(self) -> None:
        for m in (self.rates, self.clocks, self.stats):
            m.close()

    def pin_files(self) -> dict[str, int]:
        return {PIN_MAPS["rates"]: self.rates.fd, PIN_MAPS["clocks"]: self.clocks.fd, PIN_MAPS["stats"]: self.stats.fd}

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
        """Tests only: the data path owns the clocks."""
        self.clocks.update(_key(key), struct.pack("<Q", value_ns))


def _key(k: int) -> bytes:
    return struct.pack("<I", k)


def create_maps(device: str = "") -> StamperMaps:
    """Fresh maps for one stamper. Names carry the role, so ``bpftool map`` shows what each is."""
    made = []
    try:
        for name, t, v, n in (("shpe_rates", bpf_maps.MAP_ARRAY, 8, KEY_SPACE),
                              ("shpe_clocks", bpf_maps.MAP_ARRAY, 8, KEY_SPACE),
                              ("shpe_stats", bpf_maps.MAP_PERCPU_HASH, STATS_VALUE.size, STATS_MAX_ENTRIES)):
            made.append(bpf_maps.create_map(t, 4, v, n, name))
    except BaseException:
        for m in made:
            m.close()
        raise
    return StamperMaps(*made)


def adopt_maps(prog_id: int) -> StamperMaps:
    """The maps of an attached stamper, found from its program id (after an agent restart; CAP_SYS_ADMIN)."""
    got = bpf_maps.maps_of_prog(prog_id, MAP_NAMES, "edt stamper maps")
    return StamperMaps(got["rates"], got["clocks"], got["stats"])


def load(maps: StamperMaps, horizon_ns: int) -> int:
    """Load the stamper against ``maps``; returns the program fd (the caller closes it once attached)."""
    name = stamper_name(horizon_ns)
    return bpf.load_sched_cls(stamper(maps.rates.fd, maps.clocks.fd, maps.stats.fd, horizon_ns), name)


def load_fresh(horizon_ns: int, initial_q16: dict[int, int], pins: bpf_pins.PinStore | None = None,
               device: str = "") -> int:
    """New maps with the first rates written, and the stamper loaded against them; returns the program fd.

    With ``pins`` (the "edt-stamper" part of the scope), the program and its
    maps are pinned as ``device``'s entry, replacing what it held (PinError if
    that fails: the program is then not attached). The map fds are closed
    before returning: the loaded program holds the maps, and the controller
    finds them again from the attached filter (``open_for_device``).
    """
    with create_maps() as maps:
        if initial_q16:
            maps.write_rates(initial_q16)
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
    got = bpf_pins.adopt_pinned(pins, device, prog_id, MAP_NAMES, "edt stamper maps")
    return StamperMaps(got["rates"], got["clocks"], got["stats"])


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
