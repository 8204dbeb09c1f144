"""bpffs pins of shaperd's eBPF objects: where they live, pin, get back, list, remove.

Why pins: a restarted agent must reopen the maps of the classifier it finds
attached. By id (BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID) the kernel
demands CAP_SYS_ADMIN (kernel/bpf/syscall.c; upstream keeps it that way: the
by-id commands are a debug interface, bpffs files are the access-controlled
one). BPF_OBJ_PIN checks only the directory's permissions, BPF_OBJ_GET only
the pin file's, and BPF_OBJ_GET_INFO_BY_FD on an fd already held checks
nothing, so CAP_NET_ADMIN + CAP_BPF suffice.

Owns: BPF_OBJ_PIN / BPF_OBJ_GET (uapi linux/bpf.h, union bpf_attr for
BPF_OBJ_*: ``__aligned_u64 pathname; __u32 bpf_fd; __u32 file_flags;
__s32 path_fd``) and the layout ``<root>/shaperd/<scope>/<backend>/<entry>/<file>``:
scope is "host" or the named network namespace, backend the one that owns
the classifier on that device (htb, edt: each collects only its own), entry
the device name.
bpffs refuses any name with a '.', so names are escaped ('%' -> '%25',
'.' -> '%2e': eth0.100 is eth0%2e100). A set of pins is written into a
temporary entry and renamed into place, so a crash leaves either the old set,
the new set, or a temporary entry (its name holds a ':', which no device
name can): never a mix.

Must not: touch anything outside ``<root>/shaperd/<scope>``, decide which
entries are stale (the HTB backend's diff does), or judge what a pin holds
(bpf_classify checks the pinned program is the attached one).
Errors raise ``PinError`` ("verb object: cause", errno kept).
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
from pathlib import Path

from shaperd.kernel import bpf_maps
from shaperd.kernel.bpf_maps import BpfMapError
from shaperd.core.pids import pid_alive

_OBJ_PIN, _OBJ_GET = 6, 7  # enum bpf_cmd
_TMP = "pinning:"
PROBE_SCOPE_PREFIX = "probe:"


class PinError(BpfMapError):
    """A pin could not be written, read or removed."""


# Entry names inside one device's pin directory: the program, and one per map role.
PIN_PROG = "prog"


def pin_map(role: str) -> str:
    return f"map_{role}"


class _ObjAttr(ctypes.Structure):
    _fields_ = [("pathname", ctypes.c_uint64), ("bpf_fd", ctypes.c_uint32), ("file_flags", ctypes.c_uint32),
                ("path_fd", ctypes.c_int32)]


def _hint(err: int) -> str:
    if err == errno_mod.EPERM:
        return " (not on a bpffs, or no CAP_BPF)"
    if err == errno_mod.EACCES:
        return " (file permissions of the bpffs directory)"
    return ""


def obj_pin(fd: int, path: Path) -> None:
    """BPF_OBJ_PIN: a bpffs file at ``path`` that keeps the object ``fd`` refers to alive."""
    raw = ctypes.create_string_buffer(os.fsencode(str(path)))
    r, err = bpf_maps._bpf(_OBJ_PIN, _ObjAttr(pathname=ctypes.addressof(raw), bpf_fd=fd))
    if r < 0:
        raise PinError(f"pin bpf fd {fd} at {path}: {os.strerror(err)}{_hint(err)}", err)


def obj_get(path: Path) -> int:
    """BPF_OBJ_GET: a new read-write fd for the object pinned at ``path`` (the caller closes it)."""
    raw = ctypes.create_string_buffer(os.fsencode(str(path)))
    r, err = bpf_maps._bpf(_OBJ_GET, _ObjAttr(pathname=ctypes.addressof(raw)))
    if r < 0:
        raise PinError(f"open bpf pin {path}: {os.strerror(err)}{_hint(err)}", err)
    return r


def escape(name: str) -> str:
    """A name bpffs accepts (no '.') that maps back to ``name``."""
    return name.replace("%", "%25").replace(".", "%2e")


def unescape(name: str) -> str:
    return name.replace("%2e", ".").replace("%25", "%")


def _entry_name(name: str) -> str:
    if not name or "." in name or "/" in name or "\0" in name:
        raise ValueError(f"bpffs pin entry {name!r} is not a single path component without '.'")
    return name


class PinStore:
    """Pin sets under ``<root>/shaperd/<scope>[/<sub>...]``, one entry (directory) per device."""

    def __init__(self, root: str | Path, scope: str = "host", *subs: str):
        self.root = Path(root)
        self.scope = _entry_name(escape(scope)) if not scope.startswith(PROBE_SCOPE_PREFIX) else scope
        self.subs = tuple(_entry_name(escape(s)) for s in subs)

    def sub(self, name: str) -> PinStore:
        """The store one level down (a backend's own part of the scope)."""
        return PinStore(self.root, self.scope, *self.subs, name)

    def __repr__(self) -> str:
        return f"PinStore({self.base})"

    @property
    def base(self) -> Path:
        return self.root.joinpath("shaperd", self.scope, *self.subs)

    def path(self, entry: str) -> Path:
        """The directory of a device's pins (``entry`` is a device name or a name from ``entries``)."""
        return self.base / _entry_name(entry if entry.startswith(_TMP) else escape(entry))

    def entries(self) -> list[str]:
        """Every entry in this scope: device names, and temporary entries a crash left."""
        try:
            return sorted(n if n.startswith(_TMP) else unescape(n) for n in os.listdir(self.base))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise PinError(f"list bpf pins in {self.base}: {e.strerror}", e.errno or 0) from None

    def get(self, entry: str) -> dict[str, int]:
        """{file: fd} for every pin of ``entry`` (the caller closes the fds); PinError ENOENT if none."""
        d = self.path(entry)
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            raise PinError(f"open bpf pins of {entry}: no {d}", errno_mod.ENOENT) from None
        except OSError as e:
            raise PinError(f"open bpf pins in {d}: {e.strerror}", e.errno or 0) from None
        fds: dict[str, int] = {}
        try:
            for n in names:
                fds[n] = obj_get(d / n)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        return fds

    def pin(self, entry: str, objs: dict[str, int]) -> None:
        """Make ``entry`` hold exactly ``objs`` ({file: fd}), replacing what it held."""
        for n in objs:
            _entry_name(n)
        final = self.path(entry)
        tmp = self.base / f"{_TMP}{os.getpid()}:{escape(entry)}"
        try:
            d = self.root / "shaperd"
            for part in (self.scope, *self.subs, None):
                d.mkdir(mode=0o700, exist_ok=True)
                d = d / part if part else d
            self.remove(tmp.name)
            tmp.mkdir(mode=0o700)
        except OSError as e:
            raise PinError(f"make bpf pin directory {tmp}: {e.strerror}", e.errno or 0) from None
        try:
            for n, fd in objs.items():
                obj_pin(fd, tmp / n)
            self.remove(entry)
            os.rename(tmp, final)
        except OSError as e:
            self.remove(tmp.name)
            raise PinError(f"pin bpf objects at {final}: {e.strerror}", e.errno or 0) from None
        except BaseException:
            self.remove(tmp.name)
            raise

    def remove(self, entry: str) -> bool:
        """Unpin everything of ``entry`` (the objects live on while attached); False if it was not there."""
        d = self.path(entry)
        try:
            if not d.is_dir():
                d.unlink()
                return True
            for n in os.listdir(d):
                (d / n).unlink()
            d.rmdir()
        except FileNotFoundError:
            return False
        except OSError as e:
            raise PinError(f"remove bpf pins {d}: {e.strerror}", e.errno or 0) from None
        return True

    def remove_scope(self) -> None:
        """Remove this scope's directory once it is empty (probe scopes)."""
        for e in self.entries():
            self.remove(e)
        try:
            self.base.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise PinError(f"remove bpf pin directory {self.base}: {e.strerror}", e.errno or 0) from None


def probe_store(root: str | Path) -> PinStore:
    """A throwaway scope for the capability probe; also removes probe scopes of processes that are gone."""
    top = Path(root) / "shaperd"
    try:
        names = os.listdir(top)
    except OSError:
        names = []
    for n in names:
        pid = n[len(PROBE_SCOPE_PREFIX):]
        if n.startswith(PROBE_SCOPE_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            try:
                PinStore(root, n).remove_scope()
            except PinError:
                pass
    return PinStore(root, f"{PROBE_SCOPE_PREFIX}{os.getpid()}")


def pinnable(root: str | Path, mountinfo: str | Path = "/proc/self/mountinfo") -> tuple[bool, str]:
    """Whether this process could pin under ``<root>/shaperd``, found without pinning anything (for a
    probe that must write nothing: ``shaperd plan``). What BPF_OBJ_PIN checks: ``root`` is on a bpffs
    (this process's mount table, the last mount on the longest matching mount point), and the
    directory it would create its entries in (``<root>/shaperd``, or ``root`` before that exists) is
    writable and searchable by this process (faccessat with its effective ids and capabilities).
    (ok, why not)."""
    real = os.path.realpath(root)
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError as e:
        return False, f"read mount table {mountinfo}: {e.strerror or e}"
    point, kind = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mp = _unoctal(fields[4])
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(point):
            point, kind = mp, right.split()[0]
    if kind != "bpf":
        return False, f"{root} is not on a bpffs ({point or '?'} is {kind or 'not mounted'})"
    d = Path(root) / "shaperd"
    if not d.is_dir():
        d = Path(root)
    if not os.access(d, os.W_OK | os.X_OK, effective_ids=True):
        return False, f"{d}: not writable by this process (file permissions of the bpffs directory)"
    return True, f"{d} is a bpffs directory this process may write to"


def _unoctal(field: str) -> str:
    """A mountinfo path field with its octal escapes (\\040 for a space) undone."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def scope_for(netns: str | None) -> str:
    """The scope of an agent: "host", or "netns-<name>" for a named network namespace."""
    return f"netns-{netns}" if netns else "host"


def adopt_pinned(pins: PinStore, device: str, prog_id: int, names, what: str) -> dict[str, bpf_maps.BpfMap]:
    """The maps pinned for ``device`` by role (``names``: role -> map name), if its pinned program is the
    attached ``prog_id`` and every pinned map is one of that program's, by id and name. PinError naming the
    device and the reason otherwise (the caller then replaces what is attached)."""
    fds = pins.get(device)
    got: dict[str, bpf_maps.BpfMap] = {}
    try:
        pfd = fds.pop(PIN_PROG, None)
        if pfd is None:
            raise PinError(f"adopt {what} on {device}: no program pinned in {pins.path(device)}", errno_mod.ENOENT)
        try:
            info = bpf_maps.prog_info(pfd)
        finally:
            os.close(pfd)
        if info.id != prog_id:
            raise PinError(f"adopt {what} on {device}: pinned program id {info.id} is not the attached id {prog_id}",
                           errno_mod.ESTALE)
        for role, name in names.items():
            fd = fds.pop(pin_map(role), None)
            if fd is None:
                raise PinError(f"adopt {what} on {device}: map {role} not pinned", errno_mod.ENOENT)
            m = got[role] = bpf_maps.map_from_fd(fd)
            if m.id not in info.map_ids or m.name != name:
                raise PinError(f"adopt {what} on {device}: pinned map {role} (id {m.id}, {m.name or '?'}) "
                               f"is not a map of program id {prog_id}", errno_mod.ESTALE)
    except BaseException:
        for m in got.values():
            m.close()
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    return got
