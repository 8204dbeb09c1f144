"""Kill anywhere: SIGKILL ``shaperd run`` at random points of first applies and large changes, then restart.

Shared by the CI test (tests/integration/test_kill_anywhere.py, a few trials)
and the benchmark (bench/kill_anywhere.py, 100 trials). A trial passes when,
after the restart:

- the node's uplink reaches exactly the state a fresh apply of the same file
  gives (tests/tc_state.py snapshot, read through netlink, equal to that of a
  reference device that got one clean ``shaperd apply``);
- the class of a tenant the change does not touch kept its byte counter
  (not recreated) and it keeps growing under traffic;
- nothing is left behind: the killed process group is gone and no
  ``shaperd-probe-*`` namespace exists.

Kill points are drawn from a seeded RNG, uniform over the measured length
of the phase (start-up + first apply, or SIGHUP + change), so every part of
it (imports, probe, reads, the batches of writes) is hit. The random delay
before the kill is the experiment's variable, not a synchronisation: every
wait is a condition with a deadline.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shaperd.kernel.rtnl import RtnlReader
from shaperd_bed import netns

from .tc_state import snapshot

PY = sys.executable
# classifier "u32" pins the u32 path (its whole state is tc objects); "ebpf" is the default path, whose
# map entries the snapshot reads too (tests/tc_state.py).
U32 = ["env", "SHAPERD_CLASSIFIER=u32"]
CONVERGE_DEADLINE_S = 90.0
NODE_SRC, PEER_DST = "198.18.0.1", "198.18.0.2"
SENDER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
for _ in range(int(sys.argv[3])):
    s.sendto(b"x" * 200, (sys.argv[2], 9))
"""


def config(tenants: int, prefixes_each: int, change: bool) -> dict:
    """Tenant ``steady`` (the node's own source address) is the same in both files; the others change."""
    base = int(ipaddress.IPv4Address("198.19.0.0"))
    out = [{"name": "steady", "bandwidthGuarantee": "2Gbps", "priority": 100, "match": {"cidrs": [f"{NODE_SRC}/32"]}}]
    first = tenants // 3 if change else 0  # the change drops a third of the tenants and adds as many
    for i in range(first, first + tenants):
        out.append({"name": f"t{i:03d}", "bandwidthGuarantee": f"{500 + (100 if change else 0)}Mbps",
                    "bandwidthLimit": "20Gbps" if change else "10Gbps", "priority": (i % 5) * 10,
                    "match": {"cidrs": [f"{ipaddress.IPv4Address(base + i * prefixes_each + j)}/32"
                                        for j in range(prefixes_each)]}})
    return {"node": {"interfaces": ["up0"], "capacity": "100Gbps"}, "tenants": out}


def write_atomically(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@dataclass
class Trial:
    n: int
    kind: str  # "first apply" | "large change"
    kill_after_s: float
    matches: bool = False
    recover_s: float = 0.0
    counter_kept: bool | None = None
    counter_grew: bool | None = None
    leftovers: list[str] = field(default_factory=list)
    rss_kib_before: int = 0  # the daemon just before the kill (large change: it had enforced file A)
    rss_kib_after: int = 0  # the restarted daemon after its first reconcile
    interrupted: bool | None = None  # the kill left the uplink short of the final state (not just before/after)
    error: str = ""

    @property
    def ok(self) -> bool:
        return (self.matches and not self.leftovers and not self.error
                and self.counter_kept is not False and self.counter_grew is not False)


class KillBed:
    """A node namespace with uplink up0 to a peer, a reference namespace, and the daemon's files."""

    def __init__(self, tag: str, workdir: Path, tenants: int = 20, prefixes_each: int = 50,
                 classifier: str = "u32"):
        self.env = U32 if classifier == "u32" else ["env", "SHAPERD_CLASSIFIER="]
        self.nets = netns.Namespaces(stop_grace_s=0)
        self.node, self.peer, self.ref = f"{tag}-node", f"{tag}-peer", f"{tag}-ref"
        self.work = workdir
        self.cfg_path = workdir / "tenants.yaml"
        self.cfg_a, self.cfg_b = config(tenants, prefixes_each, False), config(tenants, prefixes_each, True)
        self.daemon: subprocess.Popen | None = None
        self.logs = 0
        self.resync_s = 5.0  # the daemon's periodic resync (the churn test sets it long, to count event resyncs)

    # -- set-up ------------------------------------------------------------------
    def build(self) -> "KillBed":
        for ns in (self.node, self.peer, self.ref):
            self.nets.add(ns)
        netns.veth("up0", self.node, "up1", self.peer)
        netns.addr(self.node, "up0", f"{NODE_SRC}/24")
        netns.addr(self.peer, "up1", f"{PEER_DST}/24")
        netns.neigh(self.node, "up0", PEER_DST, netns.link(self.peer, "up1")["address"])
        netns.veth("up0", self.ref, "up1", self.ref)
        self.reader = RtnlReader(self.node)
        self.ref_reader = RtnlReader(self.ref)
        self.ref_a = self._reference(self.cfg_a)
        self.ref_b = self._reference(self.cfg_b)
        return self

    def _reference(self, cfg: dict) -> dict:
        """The snapshot a fresh apply of ``cfg`` gives, on a fresh reference device."""
        netns.run(["tc", "qdisc", "del", "dev", "up0", "root"], self.ref, check=False)
        path = self.work / "ref.yaml"
        path.write_text(json.dumps(cfg))
        netns.run([*self.env, PY, "-m", "shaperd", "apply", "--config", str(path)], self.ref, timeout=300)
        return snapshot(self.ref_reader, self._ifindex(self.ref_reader), "up0")

    @staticmethod
    def _ifindex(reader: RtnlReader) -> int:
        return next(l.ifindex for l in reader.links() if l.name == "up0")

    def cleanup(self) -> None:
        self.stop_daemon()
        for r in ("reader", "ref_reader"):
            if hasattr(self, r):
                getattr(self, r).close()
        self.nets.cleanup()

    # -- the daemon --------------------------------------------------------------
    def start_daemon(self) -> subprocess.Popen:
        self.logs += 1
        log = open(self.work / f"daemon-{self.logs}.log", "w")
        self.daemon = self.nets.spawn([*self.env, PY, "-m", "shaperd", "--log-json", "run", "--config", str(self.cfg_path),
                                       "--metrics-address", "", "--no-kubernetes", "--resync-interval", str(self.resync_s)],
                                      self.node, deadline_s=600, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self.daemon

    def kill_daemon(self) -> list[str]:
        """SIGKILL the daemon's whole group; what is left of it (should be nothing)."""
        p, self.daemon = self.daemon, None
        if p is None:
            return []
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
        self.nets.procs.forget(p)
        left = []
        try:
            os.killpg(p.pid, 0)
            left.append(f"process group {p.pid} still has members")
        except ProcessLookupError:
            pass
        # Its own probe namespace only (ip netns exec execs, so the daemon's PID is the group's): other
        # shaperd processes on a shared machine may own theirs.
        left += [f"namespace {n}" for n in netns.list_netns() if n == f"shaperd-probe-{p.pid}"]
        return left

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            self.kill_daemon()

    def rss_kib(self) -> int:
        """RSS of the daemon's python process (the group leader is ip netns exec's exec'd python)."""
        try:
            for line in Path(f"/proc/{self.daemon.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except (OSError, AttributeError):
            pass
        return 0

    # -- observation -------------------------------------------------------------
    def state(self) -> dict:
        return snapshot(self.reader, self._ifindex(self.reader), "up0")

    def wait_state(self, want: dict, deadline_s: float = CONVERGE_DEADLINE_S) -> float | None:
        """Seconds until the node's uplink equals ``want`` (None: not within the deadline)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            try:
                if self.state() == want:
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - a dump racing the daemon's writes: read again
                pass
            if self.daemon is not None and self.daemon.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def wait_reconciled(self, deadline_s: float = CONVERGE_DEADLINE_S) -> bool:
        """The running daemon has logged a finished reconcile."""
        log = self.work / f"daemon-{self.logs}.log"
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            if '"reconciled"' in log.read_text():
                return True
            if self.daemon is None or self.daemon.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def steady_bytes(self) -> int:
        from shaperd.core.ids import assign_minors

        names = [t["name"] for t in self.cfg_a["tenants"]]
        cid = 0x73680000 | assign_minors(names)["steady"]
        rows = self.reader.htb_classes(self._ifindex(self.reader), "up0")
        return next((c.bytes for c in rows if c.classid == cid), -1)

    def send(self, count: int = 200) -> None:
        netns.run([PY, "-c", SENDER, NODE_SRC, PEER_DST, str(count)], self.node)

    def fresh_device(self) -> None:
        netns.run(["tc", "qdisc", "del", "dev", "up0", "root"], self.node, check=False)

    # -- the phases' lengths -----------------------------------------------------
    def measure(self) -> tuple[float, float]:
        """(start-up + first apply, SIGHUP + large change) in seconds, one clean run of each."""
        self.fresh_device()
        write_atomically(self.cfg_path, self.cfg_a)
        t0 = time.monotonic()
        self.start_daemon()
        first = self.wait_state(self.ref_a)
        if first is None:
            raise RuntimeError("the daemon did not reach the fresh-apply state at all")
        first = time.monotonic() - t0
        write_atomically(self.cfg_path, self.cfg_b)
        t0 = time.monotonic()
        os.kill(self.daemon.pid, signal.SIGHUP)
        if self.wait_state(self.ref_b) is None:
            raise RuntimeError("the daemon did not apply the large change")
        change = time.monotonic() - t0
        self.kill_daemon()
        return first, change

    # -- one trial ---------------------------------------------------------------
    def trial(self, n: int, rng: random.Random, first_s: float, change_s: float) -> Trial:
        kind = "first apply" if rng.random() < 0.5 else "large change"
        try:
            if kind == "first apply":
                self.fresh_device()
                write_atomically(self.cfg_path, self.cfg_b)
                t = Trial(n, kind, rng.uniform(0.0, first_s))
                self.start_daemon()
                time.sleep(t.kill_after_s)  # the kill point: the variable of the experiment
                before = None
            else:
                write_atomically(self.cfg_path, self.cfg_a)
                self.fresh_device()
                self.start_daemon()
                if self.wait_state(self.ref_a) is None:
                    return Trial(n, kind, 0.0, error="setup: state A not reached")
                self.send()
                before = self.steady_bytes()
                t = Trial(n, kind, rng.uniform(0.0, change_s))
                write_atomically(self.cfg_path, self.cfg_b)
                os.kill(self.daemon.pid, signal.SIGHUP)
                time.sleep(t.kill_after_s)
            t.rss_kib_before = self.rss_kib()
            t.leftovers = self.kill_daemon()
            try:
                t.interrupted = self.state() != self.ref_b
            except Exception:  # noqa: BLE001 - a half-built tree may race nothing now; unreadable counts as short
                t.interrupted = True
            t0 = time.monotonic()
            self.start_daemon()
            took = self.wait_state(self.ref_b)
            # Recovered: the state is the fresh apply's and the restarted daemon has finished its first reconcile.
            t.matches = took is not None and self.wait_reconciled()
            t.recover_s = time.monotonic() - t0 if t.matches else float("nan")
            t.rss_kib_after = self.rss_kib()
            if before is not None and t.matches:
                kept = self.steady_bytes()
                t.counter_kept = kept >= before > 0
                self.send()
                t.counter_grew = self.steady_bytes() > kept
            t.leftovers += self.kill_daemon()
        except Exception as e:  # noqa: BLE001 - a trial's failure is a result, the run goes on
            t = locals().get("t") or Trial(n, kind, 0.0)
            t.error = f"{type(e).__name__}: {e}"
            self.stop_daemon()
        return t
