"""Build and load the tiny eBPF classifier that maps ingress ifindex -> HTB class.

This module owns exactly two things:

* generating the program (a hand-encoded eBPF instruction stream, so no
  compiler, clang or libbpf is needed on the node), and
* loading it with bpf(BPF_PROG_LOAD) and handing back the program fd, and
* before the first bpf() call on kernels older than 5.11, raising RLIMIT_MEMLOCK
  as libbpf does (those kernels charge BPF memory to it, not to the memory cgroup).

It does NOT attach filters: the caller attaches the fd as a cls_bpf filter via
netlink (classic mode, i.e. *without* direct-action) and then closes the fd;
the attached filter holds its own reference to the program.

Program semantics (cls_bpf classic mode, net/sched/cls_bpf.c):
return value 0 means "no match, try the next filter"; any other value except
0xffffffff (-1, "use the filter's TCA_BPF_CLASSID") is used verbatim as the
class id.  cls_bpf reads the u32 return value (low 32 bits of r0).

What a filter dump (RTM_GETTFILTER) shows back, verified on Linux 6.18 (see
tests/integration/test_bpf_classifier.py).  TCA_OPTIONS of the filter holds:

* TCA_BPF_NAME: exactly the string passed as the filter's TCA_BPF_NAME at
  attach time (cls_bpf keeps a copy and echoes it); it is independent of the
  program's own name and absent if no name was passed.  iproute2's `tc` puts
  "file:[section]" there; we pass program_name(mapping).  We also use the same
  string as bpf_attr.prog_name, which `tc filter show` prints as "name" after
  looking the program up by TCA_BPF_ID, e.g.
  "bpf chain 0 handle 0x1 shpd_806b74f309 not_in_hw id 114
   name shpd_806b74f309 tag 2e67930956444fe3 jited".
* TCA_BPF_ID (u32 program id), TCA_BPF_TAG (8 bytes: prefix of SHA-256 of the
  instructions on 6.18, SHA-1 on older kernels), TCA_BPF_FLAGS_GEN
  (TCA_CLS_FLAGS_NOT_IN_HW).  TCA_BPF_FLAGS appears only for direct-action,
  TCA_BPF_CLASSID only if one was given.  pyroute2 0.9.7 does not decode
  ID/TAG/FLAGS_GEN (its cls_bpf nla_map stops at TCA_BPF_FLAGS; they show as
  'UNKNOWN'), so reconcile on TCA_BPF_NAME.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import functools
import hashlib
import os
import platform
import resource
import struct
from collections.abc import Mapping

__all__ = [
    "BpfError",
    "MAX_ENTRIES",
    "bpf_supported",
    "exit_",
    "ifindex_classifier",
    "jne_imm",
    "ldx_w",
    "load_sched_cls",
    "mov32_imm",
    "program_name",
    "mark_setter",
    "cgroup_classifier",
    "mark_classifier",
    "TC_ACT_UNSPEC",
]


class BpfError(Exception):
    """Loading a BPF program failed (or bpf(2) is unusable on this host)."""


# --- minimal eBPF encoder ---------------------------------------------------
# struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; }.
# On little-endian hosts (x86_64, aarch64: the only ones we load on) dst_reg
# is the low nibble of the second byte.

_BPF_LDX, _BPF_ALU, _BPF_JMP = 0x01, 0x04, 0x05  # instruction classes
_BPF_W, _BPF_MEM = 0x00, 0x60  # size / mode for loads
_BPF_MOV, _BPF_JNE, _BPF_EXIT, _BPF_K = 0xB0, 0x50, 0x90, 0x00

INSN_SIZE = 8
_OFF_INGRESS_IFINDEX = 36  # offsetof(struct __sk_buff, ingress_ifindex): 10th u32


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    if not (0 <= dst <= 10 and 0 <= src <= 10):
        raise ValueError(f"registers r{dst}/r{src}: eBPF has r0..r10")
    if not -(2**15) <= off < 2**15:
        raise ValueError(f"jump/memory offset {off} does not fit in s16")
    if not -(2**31) <= imm < 2**32:
        raise ValueError(f"immediate {imm} does not fit in 32 bits")
    # imm is packed as raw 32 bits so a u32 like 0x73680010 or 0xfffe0001
    # keeps its bit pattern; how it is *interpreted* depends on the opcode.
    return struct.pack("<BBhI", code, (src << 4) | dst, off, imm & 0xFFFFFFFF)


def ldx_w(dst: int, src: int, off: int) -> bytes:
    """dst = *(u32 *)(src + off)  (zero-extends into the 64-bit register)."""
    return _insn(_BPF_LDX | _BPF_W | _BPF_MEM, dst, src, off)


def mov32_imm(dst: int, imm: int) -> bytes:
    """w<dst> = imm; upper 32 bits zeroed.

    The 32-bit ALU form is used on purpose: the 64-bit `mov r, imm32`
    sign-extends, so a class id >= 0x80000000 would become 0xffffffff_xxxxxxxx.
    cls_bpf only looks at the low 32 bits anyway, but with the 32-bit form r0
    holds exactly the u32 class id, which keeps the program's meaning obvious.
    """
    return _insn(_BPF_ALU | _BPF_MOV | _BPF_K, dst, 0, 0, imm)


def jne_imm(dst: int, imm: int, off: int) -> bytes:
    """if r<dst> != (s64)imm goto pc + 1 + off."""
    return _insn(_BPF_JMP | _BPF_JNE | _BPF_K, dst, 0, off, imm)


def exit_() -> bytes:
    """return r0."""
    return _insn(_BPF_JMP | _BPF_EXIT)


# --- the classifier -----------------------------------------------------------
# Layout for n entries sorted by ifindex (3n + 3 instructions):
#   0            r2 = skb->ingress_ifindex
#   per entry    if r2 != ifindex goto +2; w0 = classid; exit
#   last two     w0 = 0; exit                       (no match)
#
# Why JNE and not "if r2 == ifindex goto <return block>": the verifier follows
# the fall-through and pushes every taken branch on a stack limited to
# BPF_COMPLEXITY_LIMIT_JMP_SEQ = 8192 pending branches.  With a JEQ chain the
# fall-through is "keep comparing", so n > 8192 entries fail with EFAULT
# ("The sequence of 8193 jumps is too complex", measured on 6.18); with JNE the
# fall-through is the 2-insn match block that exits, so at most one branch is
# ever pending.  Jumps are all +2, so the s16 offset range never matters.
# The remaining limit is program size: 1,000,000 insns for privileged loads
# (BPF_COMPLEXITY_LIMIT_INSNS, kernels >= 5.2; the verifier also walks ~3n+3
# insns, same bound).  Kernels < 5.2 cap programs at BPF_MAXINSNS = 4096
# (1364 entries).  Per-packet cost is linear in n; fine for a few thousand
# entries, a BPF hash map would be the next step well beyond that.
_MAX_INSNS = 1_000_000
MAX_ENTRIES = (_MAX_INSNS - 3) // 3  # 333332


def _sorted_items(mapping: Mapping[int, int]) -> list[tuple[int, int]]:
    items = sorted(mapping.items())
    for ifindex, classid in items:
        # ifindex is a positive s32 in the kernel; staying below 2**31 also
        # means the sign-extended JNE immediate equals the zero-extended load.
        if isinstance(ifindex, bool) or not isinstance(ifindex, int) or not 0 < ifindex < 2**31:
            raise ValueError(f"ifindex {ifindex!r} out of range 1..2**31-1")
        # 0 means "no match" and 0xffffffff means "use the filter's classid"
        # to cls_bpf; minor 0 is the HTB qdisc itself (HTB_DIRECT: unshaped).
        if (
            isinstance(classid, bool)
            or not isinstance(classid, int)
            or not 0 < classid < 0xFFFFFFFF
            or classid & 0xFFFF == 0
        ):
            raise ValueError(f"classid {classid!r} for ifindex {ifindex} is not a usable class id")
    return items


def ifindex_classifier(mapping: Mapping[int, int]) -> bytes:
    """Program returning mapping[skb->ingress_ifindex], or 0 (no match).

    Output depends only on the mapping's content, not on dict order.
    """
    items = _sorted_items(mapping)
    n = len(items)
    if n > MAX_ENTRIES:
        raise ValueError(
            f"{n} ifindex entries exceed the classifier limit of {MAX_ENTRIES} "
            f"(3n+3 instructions must stay within the kernel's {_MAX_INSNS} limit)"
        )
    prog = [ldx_w(2, 1, _OFF_INGRESS_IFINDEX)]
    for ifindex, classid in items:
        prog += [jne_imm(2, ifindex, 2), mov32_imm(0, classid), exit_()]
    prog += [mov32_imm(0, 0), exit_()]
    return b"".join(prog)


def program_name(mapping: Mapping[int, int]) -> str:
    """Stable 15-char name, 'shpd_' + 10 hex of sha256 over the sorted mapping.

    Fits BPF_OBJ_NAME_LEN (16 incl. NUL) and its charset [A-Za-z0-9_.], so the
    same string is valid as bpf_attr.prog_name and as the filter's
    TCA_BPF_NAME.  The version prefix lets us force new names (and thus a
    re-attach by the reconciler) if the code generator ever changes.
    """
    h = hashlib.sha256(b"shaperd-bpf-ifindex-v1\0")
    for ifindex, classid in _sorted_items(mapping):
        h.update(struct.pack("<II", ifindex, classid))
    return "shpd_" + h.hexdigest()[:10]


# --- marking pod traffic at its host-side interface --------------------------
# A pod's packets are marked where they enter the node (clsact ingress of the
# host-side veth). The mark survives bridging, routing, masquerade and VXLAN
# encapsulation (same skb, same namespace), so the uplink can classify on it
# whatever the CNI did in between. Only the bits in `mask` are written.

_OFF_MARK = 8  # offsetof(struct __sk_buff, mark)
_BPF_STX = 0x03
_BPF_AND, _BPF_OR, _BPF_X, _BPF_CALL, _BPF_ALU64 = 0x50, 0x40, 0x08, 0x80, 0x07
_BPF_LD, _BPF_DW, _BPF_IMM = 0x00, 0x18, 0x00
# Direct-action verdict "no opinion": cls_bpf goes on with the next filter, so
# other agents' programs on the same hook still run.
TC_ACT_UNSPEC = 0xFFFFFFFF
_FUNC_SKB_ANCESTOR_CGROUP_ID = 83


def stx_w(dst: int, src: int, off: int) -> bytes:
    """*(u32 *)(dst + off) = src."""
    return _insn(_BPF_STX | _BPF_W | _BPF_MEM, dst, src, off)


def and32_imm(dst: int, imm: int) -> bytes:
    return _insn(_BPF_ALU | _BPF_AND | _BPF_K, dst, 0, 0, imm)


def or32_imm(dst: int, imm: int) -> bytes:
    return _insn(_BPF_ALU | _BPF_OR | _BPF_K, dst, 0, 0, imm)


def mov64_reg(dst: int, src: int) -> bytes:
    return _insn(_BPF_ALU64 | _BPF_MOV | _BPF_X, dst, src)


def mov64_imm(dst: int, imm: int) -> bytes:
    return _insn(_BPF_ALU64 | _BPF_MOV | _BPF_K, dst, 0, 0, imm)


def ld_imm64(dst: int, imm: int) -> bytes:
    """dst = imm (full 64 bits; a two-slot instruction)."""
    if not 0 <= imm < 2**64:
        raise ValueError(f"immediate {imm} does not fit in 64 bits")
    return _insn(_BPF_LD | _BPF_DW | _BPF_IMM, dst, 0, 0, imm & 0xFFFFFFFF) + _insn(0, 0, 0, 0, imm >> 32)


def jne_reg(dst: int, src: int, off: int) -> bytes:
    return _insn(_BPF_JMP | _BPF_JNE | _BPF_X, dst, src, off)


def call(func: int) -> bytes:
    return _insn(_BPF_JMP | _BPF_CALL, 0, 0, 0, func)


def mark_setter(value: int, mask: int) -> bytes:
    """Direct-action program: skb->mark = (mark & ~mask) | value; then "no opinion"."""
    if not 0 < mask <= 0xFFFFFFFF or value & ~mask:
        raise ValueError(f"mark value 0x{value:x} must lie inside a non-empty mask 0x{mask:x}")
    return b"".join([
        ldx_w(2, 1, _OFF_MARK),
        and32_imm(2, ~mask & 0xFFFFFFFF),
        or32_imm(2, value),
        stx_w(1, 2, _OFF_MARK),
        mov32_imm(0, TC_ACT_UNSPEC),
        exit_(),
    ])


def cgroup_classifier(entries) -> bytes:
    """Classic-mode program: class of the socket's cgroup v2 ancestor, or 0.

    ``entries``: (level, cgroup id, classid) triples. For each level the
    program asks bpf_skb_ancestor_cgroup_id(skb, level) once (a pod's sockets
    live in its containers' cgroups, below the pod cgroup we know), then
    compares with every id at that level. Forwarded packets have no socket:
    the helper returns 0 and nothing matches.
    """
    by_level: dict[int, list[tuple[int, int]]] = {}
    for level, cgid, classid in sorted(entries):
        if not 0 <= level < 2**31 or not 0 < cgid < 2**64:
            raise ValueError(f"cgroup entry level={level} id={cgid} out of range")
        if not 0 < classid < 0xFFFFFFFF or classid & 0xFFFF == 0:
            raise ValueError(f"classid {classid!r} for cgroup {cgid} is not a usable class id")
        by_level.setdefault(level, []).append((cgid, classid))
    prog = [mov64_reg(6, 1)]  # r1 is clobbered by helper calls; r6 is callee-saved
    for level, pairs in by_level.items():
        prog += [mov64_reg(1, 6), mov64_imm(2, level), call(_FUNC_SKB_ANCESTOR_CGROUP_ID)]
        for cgid, classid in pairs:
            prog += [ld_imm64(3, cgid), jne_reg(0, 3, 2), mov32_imm(0, classid), exit_()]
    prog += [mov32_imm(0, 0), exit_()]
    code = b"".join(prog)
    if len(code) // INSN_SIZE > _MAX_INSNS:
        raise ValueError(f"{len(entries)} cgroup entries exceed the program size limit")
    return code


_BPF_JMP32 = 0x06


def jne32_imm(dst: int, imm: int, off: int) -> bytes:
    """if w<dst> != imm goto pc + 1 + off (32-bit compare: no sign-extension surprises)."""
    return _insn(_BPF_JMP32 | _BPF_JNE | _BPF_K, dst, 0, off, imm)


def mark_classifier(entries) -> bytes:
    """Classic-mode program: class for (skb->mark & mask) == value, or 0.

    ``entries``: (value, mask, classid) triples. Used on the uplink instead of
    u32's "match mark", which kernels without CONFIG_CLS_U32_MARK accept and
    silently ignore (the filter then matches every packet).
    """
    prog = [ldx_w(2, 1, _OFF_MARK)]
    for value, mask, classid in sorted(entries):
        if value & ~mask or not value:
            raise ValueError(f"mark 0x{value:x} must be non-zero and inside mask 0x{mask:x}")
        if not 0 < classid < 0xFFFFFFFF or classid & 0xFFFF == 0:
            raise ValueError(f"classid {classid!r} for mark 0x{value:x} is not a usable class id")
        prog += [mov64_reg(3, 2), and32_imm(3, mask), jne32_imm(3, value, 2), mov32_imm(0, classid), exit_()]
    prog += [mov32_imm(0, 0), exit_()]
    return b"".join(prog)


# --- loading ----------------------------------------------------------------

_NR_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_SCHED_CLS = 3
_LOG_SIZE = 1 << 16


class _ProgLoadAttr(ctypes.Structure):
    # Prefix of union bpf_attr used by BPF_PROG_LOAD, up to expected_attach_type.
    # Passing only this prefix is fine: the kernel zero-fills the rest.
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


def _kernel_version(release: str) -> tuple[int, int]:
    """(major, minor) of a kernel release string like "5.10.0-28-amd64"; (0, 0) if unreadable."""
    parts = release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1].split("-")[0] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def raise_memlock(release: str | None = None, prlimit=resource.prlimit) -> str:
    """On kernels < 5.11, raise RLIMIT_MEMLOCK before BPF objects are made (libbpf's bump_rlimit_memlock).

    Those kernels charge program and map memory to RLIMIT_MEMLOCK, and the default (64 KiB, or
    systemd's LimitMEMLOCK=) fails loads with EPERM. From 5.11 the memory cgroup accounts for it and
    nothing is changed. Asks for infinity, as libbpf does; without CAP_SYS_RESOURCE only up to the
    hard limit, so the soft limit is then raised to the hard one. prlimit64 is the syscall used (in
    systemd's @default set, so a unit's ~@resources deny does not block it). Returns what it did.
    """
    release = platform.release() if release is None else release
    if _kernel_version(release) >= (5, 11):
        return "not needed (memory cgroup accounting)"
    soft, hard = prlimit(0, resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return "already unlimited"
    try:
        prlimit(0, resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return "raised to unlimited"
    except (OSError, ValueError):
        pass
    if hard == soft:
        return f"left at {soft} bytes (the hard limit; raise LimitMEMLOCK=)"
    try:
        prlimit(0, resource.RLIMIT_MEMLOCK, (hard, hard))
    except (OSError, ValueError) as e:
        return f"left at {soft} bytes: raise RLIMIT_MEMLOCK: {e}"
    return f"raised to the hard limit {'unlimited' if hard == resource.RLIM_INFINITY else f'{hard} bytes'}"


@functools.cache
def _syscall():
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(f"bpf(2) syscall number unknown for architecture {platform.machine()!r}")
    raise_memlock()  # once per process, before the first bpf() (every bpf() caller gets here)
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return nr, fn


def _prog_load(insns: bytes, name: str, log: ctypes.Array | None) -> tuple[int, int]:
    nr, syscall = _syscall()
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = _ProgLoadAttr(
        prog_type=_BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt=len(insns) // INSN_SIZE,
        insns=ctypes.addressof(code),
        license=ctypes.addressof(lic),
        prog_name=name.encode(),
    )
    if log is not None:
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
    fd = syscall(
        ctypes.c_long(nr), ctypes.c_int(_BPF_PROG_LOAD),
        ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)),
    )
    return fd, (ctypes.get_errno() if fd < 0 else 0)


def load_sched_cls(insns: bytes, name: str) -> int:
    """Load insns as a BPF_PROG_TYPE_SCHED_CLS program named `name`.

    Returns a (close-on-exec) program fd; the caller must close it once the
    filter is attached.  Raises BpfError on failure, ValueError on bad input.
    """
    if not insns or len(insns) % INSN_SIZE:
        raise ValueError(f"instruction stream length {len(insns)} is not a positive multiple of 8")
    if not 0 < len(name) < 16 or not all(c.isascii() and (c.isalnum() or c in "_.") for c in name):
        raise ValueError(f"BPF object name {name!r} must be 1-15 chars of [A-Za-z0-9_.]")
    # Like libbpf: first load without a log (a verbose log can overflow the
    # buffer and itself fail the load with ENOSPC), and only on failure load
    # again with log_level=1 to explain why.
    fd, err = _prog_load(insns, name, None)
    if fd >= 0:
        return fd
    log = ctypes.create_string_buffer(_LOG_SIZE)
    fd2, _ = _prog_load(insns, name, log)
    if fd2 >= 0:  # transient failure the second attempt did not hit
        return fd2
    # The reason is at the *end* of a verifier log (the start is the insn
    # trace), and 6.4+ kernels keep the tail when the log overflows, so keep
    # the whole log if short, else its last lines.
    lines = log.value.decode(errors="replace").strip().splitlines()
    detail = " | ".join(lines if len(lines) <= 8 else ["...", *lines[-6:]])
    detail = detail or "(empty verifier log)"
    hint = ""
    if err == _errno.EPERM:
        hint = " (needs CAP_BPF+CAP_NET_ADMIN or root; RLIMIT_MEMLOCK on kernels < 5.11)"
    raise BpfError(f"load BPF program {name}: {os.strerror(err)}{hint}: {detail}")


@functools.cache
def bpf_supported() -> tuple[bool, str]:
    """Probe (once per process) whether SCHED_CLS programs can be loaded."""
    try:
        fd = load_sched_cls(mov32_imm(0, 0) + exit_(), "shpd_probe")
    except BpfError as e:
        return False, str(e)
    os.close(fd)
    return True, "ok"
