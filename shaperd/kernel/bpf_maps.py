"""The bpf(2) map layer: create, read and write eBPF maps; find programs and maps by id.

This module owns the raw bpf() commands that work on maps and on already
loaded objects (uapi linux/bpf.h, union bpf_attr):

* BPF_MAP_CREATE for HASH, ARRAY, LPM_TRIE, PERCPU_HASH and PERCPU_ARRAY
  (``create_map``), returning a ``BpfMap`` that owns the fd;
* element commands: lookup, update, delete, get_next_key (``BpfMap`` methods),
  and ``BpfMap.update_batch`` / ``delete_batch`` which use
  BPF_MAP_UPDATE_BATCH / BPF_MAP_DELETE_BATCH (5.6+) and fall back to one
  syscall per element where the kernel or map type lacks them;
* BPF_OBJ_GET_INFO_BY_FD for programs (``prog_info``) and maps (``map_info``);
* BPF_PROG_GET_FD_BY_ID / BPF_MAP_GET_FD_BY_ID (``prog_fd_by_id``,
  ``map_fd_by_id``), which is how a restarted agent adopts the maps of the
  program it finds attached (filter dump TCA_BPF_ID -> prog fd -> map ids);
* BPF_PROG_TEST_RUN (``test_run``), with the __sk_buff context in and out;
* ``ld_map_fd``: the two-slot ld_imm64 instruction with src_reg =
  BPF_PSEUDO_MAP_FD that references a map from program bytecode.

It does NOT load programs (kernel/bpf.py does), attach filters (kernel/tc.py),
or decide map contents (the backends do). Every call is one bounded syscall:
bpf() never blocks on the network, so no deadline beyond the kernel's own.
Errors raise ``BpfMapError`` ("verb object: cause", errno kept).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import functools
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from shaperd.kernel.bpf import BpfError, _syscall

__all__ = [
    "BPF_ANY",
    "BPF_EXIST",
    "BPF_F_NO_PREALLOC",
    "BPF_NOEXIST",
    "BPF_PSEUDO_MAP_FD",
    "BpfMap",
    "BpfMapError",
    "MAP_ARRAY",
    "MAP_HASH",
    "MAP_LPM_TRIE",
    "MAP_PERCPU_ARRAY",
    "MAP_PERCPU_HASH",
    "MapInfo",
    "ProgInfo",
    "SK_BUFF_SIZE",
    "SkBuff",
    "TestRunResult",
    "create_map",
    "ld_map_fd",
    "lpm_key",
    "map_fd_by_id",
    "map_info",
    "open_map_by_id",
    "possible_cpus",
    "prog_fd_by_id",
    "prog_info",
    "test_run",
]

# enum bpf_cmd
_MAP_CREATE, _MAP_LOOKUP, _MAP_UPDATE, _MAP_DELETE, _MAP_GET_NEXT_KEY = 0, 1, 2, 3, 4
_PROG_TEST_RUN = 10
_PROG_GET_FD_BY_ID, _MAP_GET_FD_BY_ID, _OBJ_GET_INFO_BY_FD = 13, 14, 15
_MAP_LOOKUP_BATCH, _MAP_UPDATE_BATCH, _MAP_DELETE_BATCH = 24, 26, 27

# enum bpf_map_type
MAP_HASH, MAP_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_LPM_TRIE = 1, 2, 5, 6, 11
_PERCPU = {MAP_PERCPU_HASH, MAP_PERCPU_ARRAY}
_NAMES = {MAP_HASH: "hash", MAP_ARRAY: "array", MAP_PERCPU_HASH: "percpu_hash",
          MAP_PERCPU_ARRAY: "percpu_array", MAP_LPM_TRIE: "lpm_trie"}

# update flags; map_flags
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
BPF_F_NO_PREALLOC = 1  # required for LPM_TRIE
BPF_PSEUDO_MAP_FD = 1
_ENOTSUPP = 524  # kernel-internal errno for "no such op on this map type"
_NO_BATCH = (_errno.EINVAL, _ENOTSUPP, _errno.EOPNOTSUPP)
SK_BUFF_SIZE = 192  # sizeof(struct __sk_buff) on 5.16+ (ends with hwtstamp)


class BpfMapError(BpfError):
    """A bpf() map/object command failed; ``errno`` keeps the kernel's reason."""

    def __init__(self, message: str, err: int = 0):
        super().__init__(message)
        self.errno = err


def _bpf(cmd: int, attr: ctypes.Structure) -> tuple[int, int]:
    nr, syscall = _syscall()
    r = syscall(ctypes.c_long(nr), ctypes.c_int(cmd), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
    return r, (ctypes.get_errno() if r < 0 else 0)


def _check(r: int, err: int, what: str) -> int:
    if r < 0:
        hint = " (needs CAP_BPF or root)" if err == _errno.EPERM else ""
        raise BpfMapError(f"{what}: {os.strerror(err)}{hint}", err)
    return r


def _buf(data: bytes):
    b = ctypes.create_string_buffer(data, len(data)) if data else ctypes.create_string_buffer(1)
    return b, ctypes.addressof(b)


# --------------------------------------------------------------- attr layouts


class _MapCreateAttr(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16), ("map_ifindex", ctypes.c_uint32),
    ]


class _ElemAttr(ctypes.Structure):
    _fields_ = [
        ("map_fd", ctypes.c_uint32), ("_pad", ctypes.c_uint32), ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),  # also next_key for GET_NEXT_KEY
        ("flags", ctypes.c_uint64),
    ]


class _BatchAttr(ctypes.Structure):
    _fields_ = [
        ("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64), ("keys", ctypes.c_uint64),
        ("values", ctypes.c_uint64), ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
        ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64),
    ]


class _TestRunAttr(ctypes.Structure):
    _fields_ = [
        ("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32), ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
        ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32), ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
        ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32),
    ]


class _GetIdAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _ProgInfo(ctypes.Structure):
    # struct bpf_prog_info prefix (stable since 4.15; fields only ever appended)
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32), ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32),
        ("gpl_compatible", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
    ]


class _MapInfo(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
    ]


# --------------------------------------------------------------------- helpers


@functools.cache
def possible_cpus() -> int:
    """Number of possible CPUs (per-CPU map values have one slot per possible CPU)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def lpm_key(prefixlen: int, data: bytes) -> bytes:
    """struct bpf_lpm_trie_key: u32 prefixlen (host order) + data (network order)."""
    if not 0 <= prefixlen <= 8 * len(data):
        raise ValueError(f"prefix length {prefixlen} exceeds the {8 * len(data)}-bit key data")
    return struct.pack("=I", prefixlen) + data


def ld_map_fd(dst: int, map_fd: int) -> bytes:
    """ld_imm64 dst, map: two slots with src_reg = BPF_PSEUDO_MAP_FD and imm = fd.

    The verifier replaces the fd by the map pointer at load time; the program
    then holds its own reference, so the fd may be closed after BPF_PROG_LOAD.
    """
    if not 0 <= dst <= 10:
        raise ValueError(f"register r{dst}: eBPF has r0..r10")
    if not 0 <= map_fd < 2**31:
        raise ValueError(f"map fd {map_fd} out of range")
    return struct.pack("<BBhI", 0x18, (BPF_PSEUDO_MAP_FD << 4) | dst, 0, map_fd) + struct.pack("<BBhI", 0, 0, 0, 0)


# ------------------------------------------------------------------------ maps


class BpfMap:
    """An open eBPF map (owns ``fd``; close it, or use as a context manager).

    Keys and values are raw bytes of exactly ``key_size`` / ``value_size``.
    For per-CPU maps ``lookup`` returns and ``update`` takes the value for
    every possible CPU concatenated, each slot padded to 8 bytes
    (``percpu_value`` builds it).
    """

    def __init__(self, fd: int, map_type: int, key_size: int, value_size: int, max_entries: int,
                 name: str = "", map_id: int = 0):
        self.fd, self.map_type, self.key_size, self.value_size = fd, map_type, key_size, value_size
        self.max_entries, self.name, self.id = max_entries, name, map_id
        self._batch_ok: bool | None = None
        self._lookup_batch_ok: bool | None = None

    # -- lifecycle
    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> BpfMap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BpfMap({self.label}, fd={self.fd})"

    @property
    def label(self) -> str:
        return f"{_NAMES.get(self.map_type, self.map_type)} map {self.name or '?'} id {self.id}"

    @property
    def value_bytes(self) -> int:
        """Size of a value buffer as user space sees it (all CPUs for per-CPU maps)."""
        if self.map_type in _PERCPU:
            return ((self.value_size + 7) // 8 * 8) * possible_cpus()
        return self.value_size

    def percpu_value(self, one: bytes) -> bytes:
        """The same per-CPU value on every CPU (padded slots)."""
        slot = (self.value_size + 7) // 8 * 8
        return one.ljust(slot, b"\0") * possible_cpus()

    def _key(self, key: bytes) -> bytes:
        if len(key) != self.key_size:
            raise ValueError(f"key of {len(key)} bytes for {self.label} with key_size {self.key_size}")
        return key

    # -- elements
    def lookup(self, key: bytes) -> bytes | None:
        kb, ka = _buf(self._key(key))
        vb = ctypes.create_string_buffer(self.value_bytes)
        r, err = _bpf(_MAP_LOOKUP, _ElemAttr(map_fd=self.fd, key=ka, value=ctypes.addressof(vb)))
        if r < 0 and err == _errno.ENOENT:
            return None
        _check(r, err, f"look up key {key.hex()} in {self.label}")
        return vb.raw

    def update(self, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
        if len(value) != self.value_bytes:
            raise ValueError(f"value of {len(value)} bytes for {self.label} expecting {self.value_bytes}")
        kb, ka = _buf(self._key(key))
        vb, va = _buf(value)
        r, err = _bpf(_MAP_UPDATE, _ElemAttr(map_fd=self.fd, key=ka, value=va, flags=flags))
        _check(r, err, f"update key {key.hex()} in {self.label}")

    def delete(self, key: bytes) -> bool:
        """Delete ``key``; False if it was not there."""
        kb, ka = _buf(self._key(key))
        r, err = _bpf(_MAP_DELETE, _ElemAttr(map_fd=self.fd, key=ka))
        if r < 0 and err == _errno.ENOENT:
            return False
        _check(r, err, f"delete key {key.hex()} from {self.label}")
        return True

    def next_key(self, key: bytes | None) -> bytes | None:
        """The key after ``key`` (the first key for None), or None at the end."""
        kb, ka = _buf(self._key(key)) if key is not None else (None, 0)
        nb = ctypes.create_string_buffer(self.key_size)
        r, err = _bpf(_MAP_GET_NEXT_KEY, _ElemAttr(map_fd=self.fd, key=ka, value=ctypes.addressof(nb)))
        if r < 0 and err == _errno.ENOENT:
            return None
        _check(r, err, f"get next key in {self.label}")
        return nb.raw

    def keys(self) -> list[bytes]:
        """All keys (get_next_key walk; a concurrent delete may restart a hash walk)."""
        out, key, seen = [], None, set()
        while (key := self.next_key(key)) is not None:
            if key in seen:  # the walk restarted after the current key vanished
                break
            seen.add(key)
            out.append(key)
        return out

    def items(self) -> dict[bytes, bytes]:
        """Every entry as {key: value}: BPF_MAP_LOOKUP_BATCH (5.6+; a few syscalls for any size)
        where the kernel has it for this map type, else a get_next_key walk (entries deleted
        during the walk are skipped)."""
        if self._lookup_batch_ok is not False:
            got = self._items_batched()
            if got is not None:
                self._lookup_batch_ok = True
                return got
            self._lookup_batch_ok = False
        return self._items_walk()

    def _items_batched(self, chunk: int = 4096) -> dict[bytes, bytes] | None:
        raw = self._lookup_batched_raw(chunk)
        if raw is None:
            return None
        keys, vals = raw
        ks, vs = self.key_size, self.value_bytes
        return {keys[i * ks:(i + 1) * ks]: vals[i * vs:(i + 1) * vs] for i in range(len(keys) // ks)}

    def items_raw(self) -> tuple[bytes, bytes]:
        """Every entry as two buffers, the keys and the values concatenated in the same order (``key_size`` and
        ``value_bytes`` each): for callers that scan a large array without building 64 Ki Python objects."""
        if self._lookup_batch_ok is not False:
            got = self._lookup_batched_raw(max(1, min(self.max_entries, 1 << 16)))  # few syscalls for an array
            if got is not None:
                self._lookup_batch_ok = True
                return got
            self._lookup_batch_ok = False
        walked = self._items_walk()
        return b"".join(walked), b"".join(walked.values())

    def _lookup_batched_raw(self, chunk: int = 4096) -> tuple[bytes, bytes] | None:
        ks, vs = self.key_size, self.value_bytes
        keys = ctypes.create_string_buffer(ks * chunk)
        vals = ctypes.create_string_buffer(vs * chunk)
        tok_in = ctypes.create_string_buffer(max(ks, 8))
        tok_out = ctypes.create_string_buffer(max(ks, 8))
        out_k: list[bytes] = []
        out_v: list[bytes] = []
        first = True
        while True:
            attr = _BatchAttr(in_batch=0 if first else ctypes.addressof(tok_in), out_batch=ctypes.addressof(tok_out),
                              keys=ctypes.addressof(keys), values=ctypes.addressof(vals), count=chunk, map_fd=self.fd)
            r, err = _bpf(_MAP_LOOKUP_BATCH, attr)
            if r < 0 and err not in (_errno.ENOENT,):
                if first and err in _NO_BATCH:
                    return None
                raise BpfMapError(f"batch look up {self.label}: {os.strerror(err)}", err)
            out_k.append(keys.raw[:attr.count * ks])
            out_v.append(vals.raw[:attr.count * vs])
            if r < 0:  # ENOENT: that was the last chunk
                return b"".join(out_k), b"".join(out_v)
            ctypes.memmove(tok_in, tok_out, len(tok_out))
            first = False

    def _items_walk(self) -> dict[bytes, bytes]:
        out = {}
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                out[k] = v
        return out

    # -- batches
    def _batch(self, cmd: int, keys: list[bytes], values: list[bytes] | None, flags: int) -> tuple[int, int]:
        """One batch syscall: (errno or 0, number of elements the kernel processed)."""
        kb, ka = _buf(b"".join(self._key(k) for k in keys))
        vb, va = _buf(b"".join(values)) if values is not None else (None, 0)
        attr = _BatchAttr(keys=ka, values=va, count=len(keys), map_fd=self.fd, elem_flags=flags)
        r, err = _bpf(cmd, attr)
        return (err if r < 0 else 0), min(attr.count, len(keys))

    def update_batch(self, entries: dict[bytes, bytes] | list[tuple[bytes, bytes]], flags: int = BPF_ANY) -> int:
        """Write all entries; returns the number of bpf() syscalls used.

        BPF_MAP_UPDATE_BATCH where the kernel supports it for this map type
        (hash and array maps, 5.6+), else one BPF_MAP_UPDATE_ELEM per entry
        (LPM tries have no batch ops: the kernel answers ENOTSUPP).
        """
        pairs = list(entries.items()) if isinstance(entries, dict) else list(entries)
        if not pairs:
            return 0
        for _, v in pairs:
            if len(v) != self.value_bytes:
                raise ValueError(f"value of {len(v)} bytes for {self.label} expecting {self.value_bytes}")
        calls = 0
        if self._batch_ok is not False:
            err, done = self._batch(_MAP_UPDATE_BATCH, [k for k, _ in pairs], [v for _, v in pairs], flags)
            calls = 1
            if not err:
                self._batch_ok = True
                return 1
            if err in _NO_BATCH and done == 0:
                self._batch_ok = False  # not for this map type / kernel: remember, go per element
                calls = 0
            elif err not in _NO_BATCH:
                raise BpfMapError(f"batch update {len(pairs)} keys in {self.label}: {os.strerror(err)}", err)
            pairs = pairs[done:]
        for k, v in pairs:
            self.update(k, v, flags)
        return calls + len(pairs)

    def delete_batch(self, keys: list[bytes]) -> int:
        """Delete keys (missing ones are ignored); returns the number of bpf() syscalls used."""
        keys = list(keys)
        if not keys:
            return 0
        calls = 0
        if self._batch_ok is not False and self.map_type not in (MAP_ARRAY, MAP_PERCPU_ARRAY):
            err, done = self._batch(_MAP_DELETE_BATCH, keys, None, 0)
            calls = 1
            if not err:
                return 1
            if err in _NO_BATCH and done == 0:
                self._batch_ok, calls = False, 0
            elif err != _errno.ENOENT:
                raise BpfMapError(f"batch delete {len(keys)} keys from {self.label}: {os.strerror(err)}", err)
            keys = keys[done:]  # ENOENT stops the batch at the missing key: go on one by one
        for k in keys:
            self.delete(k)
        return calls + len(keys)


def create_map(map_type: int, key_size: int, value_size: int, max_entries: int, name: str = "",
               flags: int | None = None) -> BpfMap:
    """BPF_MAP_CREATE. LPM tries get BPF_F_NO_PREALLOC (the kernel requires it) unless flags given."""
    if map_type not in _NAMES:
        raise ValueError(f"map type {map_type} is not one shaperd creates ({sorted(_NAMES.values())})")
    if name and (len(name) > 15 or not all(c.isascii() and (c.isalnum() or c in "_.") for c in name)):
        raise ValueError(f"BPF map name {name!r} must be 1-15 chars of [A-Za-z0-9_.]")
    if flags is None:
        flags = BPF_F_NO_PREALLOC if map_type == MAP_LPM_TRIE else 0
    attr = _MapCreateAttr(map_type=map_type, key_size=key_size, value_size=value_size,
                          max_entries=max_entries, map_flags=flags, map_name=name.encode())
    r, err = _bpf(_MAP_CREATE, attr)
    fd = _check(r, err, f"create {_NAMES[map_type]} map {name or '?'} (key {key_size} B, value {value_size} B, "
                        f"{max_entries} entries)")
    m = BpfMap(fd, map_type, key_size, value_size, max_entries, name)
    try:
        m.id = map_info(fd).id
    except BpfMapError:
        pass
    return m


# -------------------------------------------------------------- objects by id


@dataclass(frozen=True)
class ProgInfo:
    id: int
    type: int
    name: str
    tag: bytes
    map_ids: tuple[int, ...]
    xlated_prog_len: int


@dataclass(frozen=True)
class MapInfo:
    id: int
    type: int
    name: str
    key_size: int
    value_size: int
    max_entries: int
    map_flags: int


def _get_info(fd: int, info: ctypes.Structure, what: str) -> None:
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info))
    r, err = _bpf(_OBJ_GET_INFO_BY_FD, attr)
    _check(r, err, f"get info of {what} fd {fd}")


def prog_info(fd: int) -> ProgInfo:
    """BPF_OBJ_GET_INFO_BY_FD on a program, including the ids of the maps it uses."""
    info = _ProgInfo()
    _get_info(fd, info, "program")
    n = info.nr_map_ids
    ids: tuple[int, ...] = ()
    if n:
        arr = (ctypes.c_uint32 * n)()
        info = _ProgInfo(nr_map_ids=n, map_ids=ctypes.addressof(arr))
        _get_info(fd, info, "program")
        ids = tuple(arr[: min(n, info.nr_map_ids)])
    return ProgInfo(info.id, info.type, info.name.decode(errors="replace"), bytes(info.tag), ids,
                    info.xlated_prog_len)


def map_info(fd: int) -> MapInfo:
    info = _MapInfo()
    _get_info(fd, info, "map")
    return MapInfo(info.id, info.type, info.name.decode(errors="replace"), info.key_size, info.value_size,
                   info.max_entries, info.map_flags)


def _fd_by_id(cmd: int, obj_id: int, what: str) -> int:
    r, err = _bpf(cmd, _GetIdAttr(id=obj_id))
    return _check(r, err, f"open {what} id {obj_id}")


def prog_fd_by_id(prog_id: int) -> int:
    """BPF_PROG_GET_FD_BY_ID: a new fd (the caller closes it); ENOENT once the program is gone."""
    return _fd_by_id(_PROG_GET_FD_BY_ID, prog_id, "BPF program")


def map_fd_by_id(map_id: int) -> int:
    """BPF_MAP_GET_FD_BY_ID: a new fd (the caller closes it)."""
    return _fd_by_id(_MAP_GET_FD_BY_ID, map_id, "BPF map")


def map_from_fd(fd: int) -> BpfMap:
    """A ``BpfMap`` owning ``fd``, an existing map's (by id or from a pin); the fd is closed on failure."""
    try:
        mi = map_info(fd)
    except BaseException:
        os.close(fd)
        raise
    return BpfMap(fd, mi.type, mi.key_size, mi.value_size, mi.max_entries, mi.name, mi.id)


def open_map_by_id(map_id: int) -> BpfMap:
    """A ``BpfMap`` for an existing map (adoption after an agent restart)."""
    return map_from_fd(map_fd_by_id(map_id))


def maps_of_prog(prog_id: int, names: Mapping[str, str], what: str) -> dict[str, BpfMap]:
    """The maps of the attached program ``prog_id`` by role, recognised by name (``names``: role -> map
    name); the first map of each name wins. BpfMapError if one is missing. Needs CAP_SYS_ADMIN (by id)."""
    fd = prog_fd_by_id(prog_id)
    try:
        ids = prog_info(fd).map_ids
    finally:
        os.close(fd)
    role_of = {name: role for role, name in names.items()}
    maps: dict[str, BpfMap] = {}
    try:
        for mid in ids:
            m = open_map_by_id(mid)
            role = role_of.get(m.name)
            if role is None or role in maps:
                m.close()
            else:
                maps[role] = m
        missing = [r for r in names if r not in maps]
        if missing:
            raise BpfMapError(f"adopt {what} prog id {prog_id}: maps {missing} not found", _errno.ENOENT)
    except BaseException:
        for m in maps.values():
            m.close()
        raise
    return maps


# ------------------------------------------------------------------- test run


class SkBuff(ctypes.Structure):
    """struct __sk_buff as BPF_PROG_TEST_RUN takes (ctx_in) and returns (ctx_out) it.

    The kernel accepts only mark, priority, ingress_ifindex, ifindex, cb,
    tstamp, wire_len, gso_segs, gso_size and hwtstamp as non-zero input
    (net/bpf/test_run.c convert___skb_to_skb); everything else must be 0.
    """

    _fields_ = [
        ("len", ctypes.c_uint32), ("pkt_type", ctypes.c_uint32), ("mark", ctypes.c_uint32),
        ("queue_mapping", ctypes.c_uint32), ("protocol", ctypes.c_uint32), ("vlan_present", ctypes.c_uint32),
        ("vlan_tci", ctypes.c_uint32), ("vlan_proto", ctypes.c_uint32), ("priority", ctypes.c_uint32),
        ("ingress_ifindex", ctypes.c_uint32), ("ifindex", ctypes.c_uint32), ("tc_index", ctypes.c_uint32),
        ("cb", ctypes.c_uint32 * 5), ("hash", ctypes.c_uint32), ("tc_classid", ctypes.c_uint32),
        ("data", ctypes.c_uint32), ("data_end", ctypes.c_uint32), ("napi_id", ctypes.c_uint32),
        ("family", ctypes.c_uint32), ("remote_ip4", ctypes.c_uint32), ("local_ip4", ctypes.c_uint32),
        ("remote_ip6", ctypes.c_uint32 * 4), ("local_ip6", ctypes.c_uint32 * 4),
        ("remote_port", ctypes.c_uint32), ("local_port", ctypes.c_uint32), ("data_meta", ctypes.c_uint32),
        ("flow_keys", ctypes.c_uint64), ("tstamp", ctypes.c_uint64), ("wire_len", ctypes.c_uint32),
        ("gso_segs", ctypes.c_uint32), ("sk", ctypes.c_uint64), ("gso_size", ctypes.c_uint32),
        ("tstamp_type", ctypes.c_uint8), ("_pad", ctypes.c_uint8 * 3), ("hwtstamp", ctypes.c_uint64),
    ]


assert ctypes.sizeof(SkBuff) == SK_BUFF_SIZE


@dataclass(frozen=True)
class TestRunResult:
    __test__ = False  # not a pytest class
    retval: int  # the program's u32 return value
    duration_ns: int  # mean per repetition, as the kernel measured it
    data_out: bytes
    ctx_out: SkBuff | None


def test_run(prog_fd: int, data: bytes, ctx: SkBuff | None = None, repeat: int = 1) -> TestRunResult:
    """BPF_PROG_TEST_RUN: run the program on ``data`` (a frame from the Ethernet header on).

    With ``ctx`` the kernel builds the skb from it and returns the context as
    the program left it (e.g. skb->priority) in ``ctx_out``.
    """
    if len(data) < 14:
        raise ValueError(f"test packet of {len(data)} bytes is shorter than an Ethernet header")
    db, da = _buf(data)
    out = ctypes.create_string_buffer(len(data) + 256)
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(data), data_size_out=len(out), data_in=da,
                        data_out=ctypes.addressof(out), repeat=repeat)
    ctx_out = None
    if ctx is not None:
        ctx_in = SkBuff.from_buffer_copy(bytes(ctx))
        ctx_out = SkBuff()
        attr.ctx_size_in = attr.ctx_size_out = SK_BUFF_SIZE
        attr.ctx_in, attr.ctx_out = ctypes.addressof(ctx_in), ctypes.addressof(ctx_out)
    r, err = _bpf(_PROG_TEST_RUN, attr)
    _check(r, err, f"test-run BPF program fd {prog_fd}")
    return TestRunResult(attr.retval, attr.duration, out.raw[: attr.data_size_out], ctx_out)
