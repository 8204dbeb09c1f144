"""Network namespaces for the bed, the tests and the benchmarks: the one way in and out.

Owns: creating a named namespace (lo up; IPv6 duplicate address detection off,
or IPv6 off), veth pairs, addresses, static neighbours and ip(8) batches;
running a short command in a namespace; starting a long-running process in a
namespace in its own process group with a deadline; and :class:`Namespaces`,
whose cleanup ends every process it started (by process group), then every
process still inside each of its namespaces (``ip netns pids``, by pid), then
deletes the namespaces, also when the caller failed halfway.

Must not: know tenants, shaperd or traffic; use a shell (every command is an
argument list); end a process by name; touch a namespace it did not create.

Inside a namespace a command runs as ``ip netns exec NS argv...``. Every
process starts in a new session, so its process group id is its pid and
``os.killpg`` ends it together with whatever it forked: killing only the pid
of ``ip netns exec`` (or of a Python that forked helpers) can leave a child
running in the namespace.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

IP = "ip"
TC = "tc"
SHORT_TIMEOUT_S = 30.0  # one ip/tc/sysctl call; far above what any takes, so only a hang reaches it
_PR_SET_PDEATHSIG = 1


class CommandError(subprocess.CalledProcessError):
    """A command failed: argv, return code and stderr (a CalledProcessError, so callers of either fit)."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, stdout: str = ""):
        super().__init__(returncode, list(argv), stdout, stderr)
        self.argv = list(argv)

    def __str__(self) -> str:
        return f"command failed (rc={self.returncode}): {' '.join(self.argv)}: {(self.stderr or '').strip()}"


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    """*argv* wrapped so that it runs inside *netns* (as is for None: this process's namespace)."""
    return list(argv) if netns is None else [IP, "netns", "exec", netns, *argv]


# ------------------------------------------------------------------ processes


def run(argv: Sequence[str], netns: str | None = None, *, check: bool = True, timeout: float = SHORT_TIMEOUT_S,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run a short command to completion (text, output captured), in its own process group.

    On *timeout* the whole group is killed and ``subprocess.TimeoutExpired`` raised.
    """
    full = in_netns(netns, argv)
    with subprocess.Popen(full, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as p:
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.communicate(timeout=5)
            raise
    if check and p.returncode != 0:
        raise CommandError(full, p.returncode, err, out)
    return subprocess.CompletedProcess(full, p.returncode, out, err)


def _die_with_parent() -> None:  # in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # pragma: no cover - best effort: cleanup still ends it
        pass


def spawn(argv: Sequence[str], netns: str | None = None, *, deadline_s: float | None = None,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text: bool = True,
          env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Start a long-running process (in *netns*) in its own process group.

    It is SIGKILLed (whole group) when this process dies (PR_SET_PDEATHSIG; the
    parent is the starting thread, so start from a thread that lives as long)
    and, with *deadline_s*, when that many seconds have passed.
    """
    p = subprocess.Popen(in_netns(netns, argv), stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env,
                         cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)
    if deadline_s is not None:
        timer = threading.Timer(deadline_s, _expire, (p, deadline_s))
        timer.daemon = True
        timer.start()
        p.deadline_timer = timer  # type: ignore[attr-defined]
    return p


def _expire(p: subprocess.Popen, deadline_s: float) -> None:
    if p.poll() is None:
        log.warning("process %d (%s) passed its %.0f s deadline: killed", p.pid, " ".join(map(str, p.args)),
                    deadline_s)
        p.deadline_expired = True  # type: ignore[attr-defined]
        _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    """Signal *p*'s process group if it leads one (everything started here), else *p* alone."""
    if p.poll() is not None:
        return
    try:
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
        else:  # started elsewhere without a session of its own: its group is not ours to signal
            os.kill(p.pid, sig)
    except ProcessLookupError:
        pass


def stop(p: subprocess.Popen, grace_s: float = 1.0) -> None:
    """End *p* and its group: TERM, up to *grace_s* to exit, then KILL (KILL at once for 0)."""
    timer = getattr(p, "deadline_timer", None)
    if timer is not None:
        timer.cancel()
    if grace_s > 0:
        _signal_group(p, signal.SIGTERM)
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(p, signal.SIGKILL)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
        log.warning("process %d did not die", p.pid)
    for f in (p.stdin, p.stdout, p.stderr):
        if f is not None:
            try:
                f.close()
            except OSError:  # pragma: no cover
                pass


class Processes:
    """The long-running processes of one owner; :meth:`stop_all` ends every one of them."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def spawn(self, argv: Sequence[str], netns: str | None = None, **kw) -> subprocess.Popen:
        """:func:`spawn`, remembered."""
        return self.append(spawn(argv, netns, **kw))

    def append(self, p: subprocess.Popen) -> subprocess.Popen:
        """Take over a process started elsewhere (list-like: tests do ``bed.procs.append(popen)``)."""
        with self._lock:
            self._procs.append(p)
        return p

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs]

    def live(self) -> list[subprocess.Popen]:
        with self._lock:
            return [p for p in self._procs if p.poll() is None]

    def forget(self, p: subprocess.Popen) -> None:
        """Drop a process that has been waited for."""
        with self._lock:
            if p in self._procs and p.poll() is not None:
                self._procs.remove(p)

    def stop(self, p: subprocess.Popen, grace_s: float = 1.0) -> None:
        stop(p, grace_s)

    def stop_all(self, grace_s: float = 1.0) -> None:
        """TERM every live group at once, one shared *grace_s*, then KILL what is left."""
        with self._lock:
            procs, self._procs = list(self._procs), []
        if grace_s > 0:
            for p in procs:
                _signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for p in procs:
            stop(p, 0)


# ------------------------------------------------------------------ namespaces and links


def list_netns() -> list[str]:
    out = run([IP, "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def add_netns(name: str, *, ipv6: bool = True) -> str:
    """Create namespace *name* (an error if it exists) and :func:`configure_netns` it."""
    run([IP, "netns", "add", name])
    configure_netns(name, ipv6=ipv6)
    return name


def configure_netns(name: str, *, ipv6: bool = True) -> None:
    """lo up; IPv6 without duplicate address detection (addresses usable at once), or with
    ``ipv6=False`` IPv6 off altogether."""
    for key in ("all", "default"):
        setting = f"net.ipv6.conf.{key}.accept_dad=0" if ipv6 else f"net.ipv6.conf.{key}.disable_ipv6=1"
        run(["sysctl", "-qw", setting], name)
    run([IP, "-n", name, "link", "set", "lo", "up"])


def veth(a: str, ns_a: str, b: str, ns_b: str, *, up: bool = True) -> None:
    """A veth pair made directly inside its namespaces (never visible in this one); both ends up."""
    run([IP, "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b])
    if up:
        run([IP, "-n", ns_a, "link", "set", a, "up"])
        run([IP, "-n", ns_b, "link", "set", b, "up"])


def addr(netns: str, dev: str, *cidrs: str) -> None:
    """Addresses on *dev*; IPv6 ones ``nodad`` (usable at once)."""
    for c in cidrs:
        run([IP, "-n", netns, "addr", "add", c, "dev", dev, *(["nodad"] if ":" in c else [])])


def link(netns: str, dev: str) -> dict:
    """``ip -j link show`` of one device: ``ifindex``, ``address`` (MAC), ``flags``..."""
    return json.loads(run([IP, "-n", netns, "-j", "link", "show", "dev", dev]).stdout)[0]


def neigh(netns: str, dev: str, ip: str, lladdr: str) -> None:
    """A permanent neighbour entry: no ARP/ND traffic for *ip* on *dev*."""
    run([IP, "-n", netns, "neigh", "replace", ip, "lladdr", lladdr, "dev", dev, "nud", "permanent"])


def batch(netns: str, lines: Iterable[str], timeout: float = 120.0) -> None:
    """Many ip(8) commands in one process (``ip -n NS -batch -``): one per line, no shell."""
    text = "".join(f"{line}\n" for line in lines)
    if text:
        run([IP, "-n", netns, "-batch", "-"], input=text, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_netns_pids(netns: str, grace_s: float = 0.3) -> None:
    """End every process inside *netns* (``ip netns pids``), by pid: TERM, up to *grace_s* for them
    to exit, KILL, then wait (5 s at most) until they are gone. Never this process."""
    out = run([IP, "netns", "pids", netns], check=False).stdout
    pids = [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGTERM and grace_s <= 0:
            continue
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while (pids := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.01)
        if not pids:
            return


def delete_netns(netns: str, grace_s: float = 0.3) -> None:
    """Kill what runs inside *netns*, then delete it (its links go with it)."""
    kill_netns_pids(netns, grace_s)
    run([IP, "netns", "del", netns], check=False)


class Namespaces:
    """The namespaces and processes one owner made; :meth:`cleanup` (or leaving the ``with``)
    removes all of them, whatever failed before. Only the creating process cleans up: a forked
    child (pyroute2 forks) that unwinds must not delete its parent's namespaces."""

    def __init__(self, *, stop_grace_s: float = 1.0):
        self.names: list[str] = []
        self.procs = Processes()
        self.stop_grace_s = stop_grace_s
        self._owner = os.getpid()

    def add(self, name: str, *, ipv6: bool = True) -> str:
        """Create *name* (refused if it exists: never adopt someone else's) and own it from then on,
        so a namespace whose set-up fails halfway is still removed."""
        run([IP, "netns", "add", name])
        self.names.append(name)
        configure_netns(name, ipv6=ipv6)
        return name

    def spawn(self, argv: Sequence[str], netns: str | None = None, **kw) -> subprocess.Popen:
        return self.procs.spawn(argv, netns, **kw)

    def remove(self, name: str) -> None:
        if name in self.names:
            self.names.remove(name)
        delete_netns(name, self.stop_grace_s)

    def cleanup(self) -> None:
        if os.getpid() != self._owner:
            return
        try:
            self.procs.stop_all(self.stop_grace_s)
        finally:
            existing = set(list_netns())
            for name in reversed(self.names):
                if name not in existing:
                    continue
                try:
                    delete_netns(name, self.stop_grace_s)
                except Exception as e:  # noqa: BLE001 - go on with the others, say which one
                    log.warning("could not remove netns %s: %s", name, e)
            self.names.clear()

    def __enter__(self) -> "Namespaces":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()
