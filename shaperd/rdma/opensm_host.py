"""The subnet manager's host: OpenSM's options file written atomically, and the running opensm told to re-read it.

For ``shaperd rdma opensm-config --write`` on a host that runs OpenSM (small
clusters run it on a head node). The file is replaced by rename from a
temporary file in the same directory, fsynced, with the old file's mode and
owner; the directory is fsynced after the rename (core/atomicfile.py). An
opensm is found by its pid file, or by scanning processes for the ``opensm``
executable whose options file (``-F``/``--config``, default
/etc/opensm/opensm.conf) is the one written, and is sent SIGHUP by pid
(OpenSM re-reads its options file and runs a heavy sweep; it reprograms
SL2VL and VLArb without a restart). Never kills, never signals by name.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from shaperd.core import atomicfile
from shaperd.core.errors import ShaperdError

DEFAULT_OPENSM_CONFIG = "/etc/opensm/opensm.conf"  # what opensm reads without -F (opensm --help)
OPENSM = "opensm"
# OpenSM's getopt short options (opensm/main.c); a letter followed by ':' takes an argument.
_SHORT_OPTIONS = "F:c:i:w:O:f:ed:D:g:l:L:s:t:a:u:m:X:R:zM:U:S:P:Y:ANZ:WBIQvVhoryxp:n:q:k:C:G:H:"
_TAKES_ARG = {c for i, c in enumerate(_SHORT_OPTIONS) if c != ":" and _SHORT_OPTIONS[i + 1:i + 2] == ":"}


class SmHostError(ShaperdError):
    """Writing the options file or signalling opensm failed: 'verb object: cause'."""


def read_text(path: Path) -> str | None:
    """The file's text (bytes that are not UTF-8 survive a round trip), or None when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SmHostError(f"read {path}: {e.strerror or e}") from e
    return data.decode("utf-8", errors="surrogateescape")


def write_atomic(path: Path, text: str) -> Path:
    """Replace the file (through a symlink, its target) so a reader sees the old or the new text, never a mix.

    core/atomicfile.py's writer, as an edit: the old file's mode and owner are kept (0644 for a new
    file), and the directory is fsynced after the rename. Returns the real path written."""
    try:
        return atomicfile.write_atomic(path, text.encode("utf-8", errors="surrogateescape"), 0o644, edit=True)
    except atomicfile.AtomicWriteError as e:
        raise SmHostError(str(e)) from e


def config_of(cmdline: list[str], cwd: str | None) -> str:
    """The options file an opensm command line reads (-F FILE, -FFILE, --config FILE, --config=FILE)."""
    value: str | None = None
    args = cmdline[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break
        if a == "--config" and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if a.startswith("--config="):
            value = a.split("=", 1)[1]
        elif a.startswith("-") and not a.startswith("--") and len(a) > 1:
            for j, c in enumerate(a[1:], start=1):
                if c in _TAKES_ARG:
                    rest = a[j + 1:]
                    arg = rest if rest else (args[i + 1] if i + 1 < len(args) else None)
                    if not rest:
                        i += 1
                    if c == "F" and arg is not None:
                        value = arg
                    break
        i += 1
    return os.path.realpath(os.path.join(cwd or "/", value if value is not None else DEFAULT_OPENSM_CONFIG))


@dataclass(frozen=True)
class OpenSmProcess:
    pid: int
    config: str  # the options file it reads, resolved


def _is_opensm(p: psutil.Process) -> bool:
    try:
        exe = p.exe()
    except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
        exe = ""
    return p.name() == OPENSM or os.path.basename(exe) == OPENSM


def _describe(p: psutil.Process) -> OpenSmProcess:
    try:
        cwd = p.cwd()
    except (psutil.AccessDenied, OSError):
        cwd = None
    return OpenSmProcess(pid=p.pid, config=config_of(p.cmdline(), cwd))


def running_opensm() -> list[OpenSmProcess]:
    """Every opensm process this user can see, with the options file each reads."""
    out = []
    for p in psutil.process_iter():
        try:
            if _is_opensm(p):
                out.append(_describe(p))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sorted(out, key=lambda o: o.pid)


def from_pid_file(path: Path) -> OpenSmProcess:
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise SmHostError(f"read opensm pid file {path}: {e.strerror or e}") from e
    if not text.isdigit():
        raise SmHostError(f"opensm pid file {path}: expected a process id, got {text[:40]!r}")
    try:
        p = psutil.Process(int(text))
        if not _is_opensm(p):
            raise SmHostError(f"opensm pid file {path} names pid {text}, which is {p.name()!r}, not opensm; "
                              "not signalled")
        return _describe(p)
    except psutil.NoSuchProcess as e:
        raise SmHostError(f"opensm pid file {path} names pid {text}, which is not running") from e
    except psutil.AccessDenied as e:
        raise SmHostError(f"inspect pid {text} from {path}: permission denied") from e


def hup(proc: OpenSmProcess) -> None:
    """SIGHUP to that opensm, by pid; refuses if the pid now belongs to something else."""
    try:
        p = psutil.Process(proc.pid)
        if not _is_opensm(p):
            raise SmHostError(f"signal opensm pid {proc.pid}: the pid now belongs to {p.name()!r}; not signalled")
        p.send_signal(signal.SIGHUP)
    except psutil.NoSuchProcess as e:
        raise SmHostError(f"signal opensm pid {proc.pid}: it exited") from e
    except psutil.AccessDenied as e:
        raise SmHostError(f"signal opensm pid {proc.pid}: permission denied") from e
