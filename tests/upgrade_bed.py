"""The upgrade bed: release N-1 (the previous commit's wheel) and N (this checkout) in turn on one shaped uplink.

Shared by tests/integration/test_upgrade.py. Owns:

- building release N-1: ``git worktree add --detach`` of ``HEAD^`` in a temporary directory, ``pip wheel
  --no-deps --no-build-isolation`` (setuptools and setuptools-scm are in the test venv: offline), ``pip install
  --no-deps --target DIR``; it runs as ``python -P -m shaperd`` with ``PYTHONPATH=DIR`` (``-P``: the current
  directory, a checkout holding ``shaperd/``, never shadows it), its dependencies from the test venv. Release N is
  this checkout's editable install;
- the bed: a node namespace whose uplink veth ``up0`` goes to a peer namespace; three senders in the node
  namespace, one per tenant source address, each a paced UDP sender that records what it offered (its own
  counters, monotonic clock, which every namespace shares);
- the sampler: the HTB classes' counters and the enforcing objects (root qdisc, classes, classifier) read through
  netlink every ``SAMPLE_EVERY_S``;
- the watcher of writes: an rtnetlink socket in the node namespace subscribed to link and tc notifications. The
  kernel sends one for every qdisc, class, filter or link that is added, changed or deleted (a no-op replace
  included) and none for reads, so its count over a daemon's first reconcile is the number of netlink writes that
  reconcile made, counted by the kernel rather than by the daemon;
- the pure checks the test asserts (``over_limit_windows``, ``guarantee_windows``, ``tree_gaps``,
  ``counter_resets``, ``missing_families``), kept free of I/O so the unit part of the test proves each can fail.

Every process is started through ``shaperd_bed.netns.Namespaces`` (own process group, deadline) and ended by
group id; the namespaces, the temporary worktree and the temporary directories go in ``cleanup``, also when the
test failed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shaperd.core.ids import assign_minors
from shaperd.core.units import ticks_to_bytes
from shaperd.kernel import nlmsg
from shaperd.kernel.rtnl import RtnlReader, open_socket
from shaperd_bed import netns

from tests import procs

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 0.2
WINDOW_S = 1.0
# One packet past the last token (HTB lets it through): the senders' largest datagram (below the MTU, so no
# GSO super-packets) plus its IP, UDP and Ethernet headers. Used as the per-window slack in both checks.
PAYLOAD = 1400
ONE_PACKET_BYTES = PAYLOAD + 28 + 14
HTB_HANDLE = 0x7368  # shaperd's root HTB qdisc 7368: (core/ids.py)

NODE_SRC = {"gold": "198.18.1.1", "capped": "198.18.2.1", "bulk": "198.18.3.1"}
PEER = "198.18.0.2"
# Rates a busy 2-core machine offers easily (1400-byte UDP at a few hundred Mbit/s is tens of thousands of
# packets a second) and the shaper, not the CPU, is the bottleneck: the three offer 440 Mbit/s into a
# 200 Mbit/s uplink.
CAPACITY_MBIT = 200
GOLD_GUARANTEE_MBIT, CAPPED_LIMIT_MBIT = 60, 40
OFFER_MBIT = {"gold": 120, "capped": 80, "bulk": 240}


def config() -> dict:
    return {"node": {"interfaces": ["up0"], "capacity": f"{CAPACITY_MBIT}Mbps"},
            "tenants": [
                {"name": "gold", "bandwidthGuarantee": f"{GOLD_GUARANTEE_MBIT}Mbps", "priority": 100,
                 "match": {"cidrs": [f"{NODE_SRC['gold']}/32"]}},
                {"name": "capped", "bandwidthGuarantee": "10Mbps", "bandwidthLimit": f"{CAPPED_LIMIT_MBIT}Mbps",
                 "priority": 50, "match": {"cidrs": [f"{NODE_SRC['capped']}/32"]}},
                {"name": "bulk", "bandwidthGuarantee": "10Mbps", "priority": 10,
                 "match": {"cidrs": [f"{NODE_SRC['bulk']}/32"]}},
            ]}


def classid(tenant: str) -> int:
    return (HTB_HANDLE << 16) | assign_minors([t["name"] for t in config()["tenants"]])[tenant]


# A paced UDP sender: 1 ms slots at the asked rate; every 10 ms one line "monotonic_s cumulative_bytes" of
# what send() accepted (a datagram the qdisc drops still counts: it was offered). Imports nothing of shaperd.
SENDER = r"""
import socket, sys, time
src, dst, mbit, seconds, size = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
buf = b"x" * size
per_slot = mbit * 1e6 / 8 * 0.001
t0 = time.monotonic(); nxt = t0; credit = 0.0; sent = 0; said = 0.0
print(f"{t0:.6f} 0", flush=True)
while True:
    now = time.monotonic()
    if now - t0 >= seconds:
        break
    if now - said >= 0.01:
        print(f"{now:.6f} {sent}", flush=True); said = now
    if now < nxt:
        time.sleep(min(nxt - now, 0.001)); continue
    credit += per_slot; nxt += 0.001
    if nxt < now - 0.05:
        nxt = now
    while credit >= size:
        try:
            sent += s.sendto(buf, (dst, 9))
        except OSError:
            pass
        credit -= size
print(f"{time.monotonic():.6f} {sent}", flush=True)
"""


SCRAPER = r"""
import json, sys, time, urllib.request
url, times, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
out = []
while len(out) < times:
    try:
        out.append(urllib.request.urlopen(url, timeout=5).read().decode())
        if len(out) < times:
            time.sleep(0.5)
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"no answer from {url}: {e}")
        time.sleep(0.1)
print(json.dumps(out))
"""


# -- release N-1 ---------------------------------------------------------------------------------
@dataclass
class Release:
    name: str  # "N-1" | "N"
    env: dict
    expect_commit: str  # 12 hex digits

    def argv(self, *args: str) -> list[str]:
        return [PY, "-P", "-m", "shaperd", *args]


def previous_commit(repo: Path = REPO) -> str:
    r = procs.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD^"], timeout_s=30, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"build release N-1 from {repo}: HEAD has no parent commit (a shallow clone or the "
                           "first commit); the upgrade test needs the previous commit (git fetch --unshallow)")
    return r.stdout.strip()


def head_commit(repo: Path = REPO) -> str:
    return procs.run(["git", "-C", str(repo), "rev-parse", "HEAD"], timeout_s=30).stdout.strip()


def build_previous(work: Path, repo: Path = REPO) -> Release:
    """Release N-1 built and installed under ``work``; the temporary worktree is removed before returning."""
    commit = previous_commit(repo)
    src, wheels, target = work / "n-1-src", work / "n-1-wheel", work / "n-1"
    procs.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(src), commit], timeout_s=120)
    try:
        procs.run([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                   str(wheels), str(src)], timeout_s=300)
    finally:
        procs.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(src)], timeout_s=60, check=False)
        procs.run(["git", "-C", str(repo), "worktree", "prune"], timeout_s=60, check=False)
    (wheel,) = wheels.glob("shaperd-*.whl")
    procs.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
              timeout_s=300)
    env = dict(os.environ, PYTHONPATH=str(target))
    return Release("N-1", env, commit[:12])


def this_release(repo: Path = REPO) -> Release:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return Release("N", env, head_commit(repo)[:12])


def version_of(rel: Release, cwd: Path) -> str:
    """``shaperd --version`` of the release, run from ``cwd`` (never the checkout: see the module's docstring)."""
    return subprocess.run(rel.argv("--version"), env=rel.env, cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=True, start_new_session=True).stdout.strip()


# -- samples -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClassCount:
    bytes: int
    packets: int
    drops: int
    overlimits: int
    rate_Bps: int
    ceil_Bps: int
    buffer_bytes: int  # the depth of the class's own (rate) bucket
    cbuffer_bytes: int  # the depth of its ceil bucket


@dataclass(frozen=True)
class Sample:
    t_before: float
    t_after: float
    classes: dict  # classid -> ClassCount
    tree: tuple | None  # the enforcing objects' identity (None: could not be read)
    error: str = ""


def tree_of(reader: RtnlReader, ifindex: int) -> tuple:
    """What enforces on the device: the root qdisc (handle, kind), each class's (id, rate, ceil), the
    classifier's filters (kind, prio, classid) under the root and on clsact egress; counters left out."""
    qd = reader.qdiscs(ifindex, "up0")
    root = sorted((q.handle, q.kind) for q in qd if q.parent == 0xFFFFFFFF)
    classes = sorted((c.classid, c.rate_Bps, c.ceil_Bps) for c in reader.htb_classes(ifindex, "up0"))
    filters = []
    for parent in sorted({q.handle for q in qd} | {0xFFFFFFF3}):
        try:
            rows = reader.filters(ifindex, parent, "up0")
        except Exception:  # noqa: BLE001 - no such parent (no clsact): no filters there
            continue
        # handle and program id too: a filter deleted and added again, or a program reloaded, is a change
        filters += [(parent, f.kind, f.prio, f.handle, f.classid, f.prog_id) for f in rows
                    if f.classid or f.keys or f.kind == "bpf"]
    return (tuple(root), tuple(classes), tuple(sorted(set(filters))))


def read_sample(reader: RtnlReader, ifindex: int) -> Sample:
    t0 = time.monotonic()
    try:
        rows = reader.htb_classes(ifindex, "up0")
    except Exception as e:  # noqa: BLE001 - a read that fails is a sample with no tree, reported as a gap
        return Sample(t0, time.monotonic(), {}, None, f"{type(e).__name__}: {e}")
    t1 = time.monotonic()
    classes = {c.classid: ClassCount(c.bytes, c.packets, c.drops, c.overlimits, c.rate_Bps, c.ceil_Bps,
                                      ticks_to_bytes(c.buffer_ticks, c.rate_Bps * 8),
                                      ticks_to_bytes(c.cbuffer_ticks, c.ceil_Bps * 8)) for c in rows}
    try:
        tree = tree_of(reader, ifindex)
    except Exception as e:  # noqa: BLE001
        return Sample(t0, t1, classes, None, f"{type(e).__name__}: {e}")
    return Sample(t0, t1, classes, tree)


class Sampler:
    """A thread reading the uplink every SAMPLE_EVERY_S into ``samples`` until ``stop``."""

    def __init__(self, node_ns: str):
        self.reader = RtnlReader(node_ns)
        self.ifindex = next(l.ifindex for l in self.reader.links() if l.name == "up0")
        self.samples: list[Sample] = []
        self.marks: list[tuple[float, str]] = []  # (monotonic, "N started", ...) for the failure messages
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="upgrade-sampler", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic(), what))

    def _loop(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            self.samples.append(read_sample(self.reader, self.ifindex))
            nxt += SAMPLE_EVERY_S
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def stop(self) -> None:
        """Idempotent: the test stops it before its checks and again in its cleanup."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self.reader is not None:
            self.reader.close()
            self.reader = None


# -- writes seen by the kernel -------------------------------------------------------------------
RTMGRP_LINK, RTMGRP_TC = 0x1, 0x8
RTM_NAMES = {16: "NEWLINK", 17: "DELLINK", 36: "NEWQDISC", 37: "DELQDISC", 40: "NEWTCLASS", 41: "DELTCLASS",
             44: "NEWTFILTER", 45: "DELTFILTER", 100: "NEWCHAIN", 101: "DELCHAIN"}


class WriteWatch:
    """Link and tc notifications in a namespace from ``open`` on: every write anyone made there."""

    def __init__(self, node_ns: str):
        self.sock = open_socket(node_ns, "/run", RTMGRP_LINK | RTMGRP_TC, nonblocking=True)
        self.seen: list[str] = []
        self.overflow = False

    def drain(self) -> list[str]:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as e:  # ENOBUFS: more notifications than the buffer held: certainly writes
                self.overflow = True
                self.seen.append(f"overflow ({e.strerror})")
                continue
            self.seen += [RTM_NAMES.get(m.type, str(m.type)) for m in nlmsg.messages(data)]
        return self.seen

    def close(self) -> None:
        self.sock.close()


# -- metrics and the changelog -------------------------------------------------------------------
def families(exposition: str) -> set[str]:
    """Metric family names of a Prometheus text exposition (its # TYPE lines)."""
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+) \S+", exposition, re.M)}


def unreleased(changelog: str) -> str:
    """The text of the [Unreleased] section of a Keep a Changelog file ('' if it has none)."""
    m = re.search(r"^## \[Unreleased\][^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    return m.group(1) if m else ""


def missing_families(old: set[str], new: set[str], unreleased_text: str) -> list[str]:
    """Families of the old release the new one lacks and the changelog's [Unreleased] does not name."""
    named = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", unreleased_text))
    return sorted(f for f in old - new if f not in named)


# -- the checks ----------------------------------------------------------------------------------
def windows(samples: list[Sample], span_s: float = WINDOW_S):
    """(a, b) pairs of readable samples with b the first at least ``span_s`` after a (narrow interval)."""
    ok = [s for s in samples if s.tree is not None]
    j = 0
    for i, a in enumerate(ok):
        j = max(j, i + 1)
        while j < len(ok) and ok[j].t_before - a.t_after < span_s:
            j += 1
        if j == len(ok):
            return
        yield a, ok[j]


def over_limit_windows(samples: list[Sample], cid: int, slack_bytes: int = ONE_PACKET_BYTES) -> list[str]:
    """Windows in which class ``cid`` sent more than its ceil allows: ceil * (widest interval) + cbuffer + slack."""
    bad = []
    for a, b in windows(samples):
        if cid not in a.classes or cid not in b.classes:
            continue
        sent = b.classes[cid].bytes - a.classes[cid].bytes
        c = b.classes[cid]
        allowed = c.ceil_Bps * (b.t_after - a.t_before) + c.cbuffer_bytes + slack_bytes
        if sent > allowed:
            bad.append(f"{a.t_before:.2f}..{b.t_after:.2f}: sent {sent} B, the limit allows {allowed:.0f} B")
    return bad


@dataclass
class GuaranteeResult:
    short: list[str] = field(default_factory=list)  # windows below the guarantee
    measured: int = 0
    excluded: int = 0  # the sender offered less than the guarantee there (its own counters)
    lags: list[float] = field(default_factory=list)  # per measured window, the sender's lag D (bytes)


EDGE_S = 0.05  # a window is measured only if the sender's records start and end within this of its edges


def offered_inside(records: list[tuple[float, int]], t0: float, t1: float) -> list[tuple[float, int]]:
    """The sender's own records (monotonic s, cumulative bytes) that fall inside [t0, t1]."""
    return [r for r in records if t0 <= r[0] <= t1]


def guarantee_windows(samples: list[Sample], cid: int, guarantee_Bps: float, offered: list[tuple[float, int]],
                      slack_bytes: int = ONE_PACKET_BYTES) -> GuaranteeResult:
    """Class ``cid`` got its guarantee in every 1 s window where its sender demonstrably asked for it.

    Measured: the sender's records (every 10 ms) cover the window's narrow interval [t1, t2] to within EDGE_S at
    both ends and show it offered at least the guarantee over them. Otherwise the window is excluded and counted
    (the sender could not offer it: a busy CPU).

    The floor, derived: let D be the most the sender's cumulative offer ever lagged behind a line rising at G
    from its first record in the window (0 for a sender that kept up; a stall makes it positive), and take t*
    the last instant in [t1, t2] at which the class's queue was empty (t1 if never). Up to t* everything offered
    since t1 has left, at least G * (t* - t1) - D less one record interval's worth (where within it the bytes
    went is unknown) and what the uncovered edges could have held. From t* on the class was backlogged: a
    backlogged HTB class in green mode sends whenever its own bucket holds a token, the bucket refills at G, and
    bytes it borrows above G are not charged to it, so it sends at least G * (t2 - t*) less what its bucket can
    hold unspent at t2 (its buffer) and the packet at the edge. Together:
    sent >= G * (t2 - t1 - edges - longest record interval) - D - buffer - one packet.
    """
    res = GuaranteeResult()
    for a, b in windows(samples):
        if cid not in a.classes or cid not in b.classes:
            continue
        t1, t2 = a.t_after, b.t_before
        inside = offered_inside(offered, t1, t2)
        if (len(inside) < 2 or inside[0][0] - t1 > EDGE_S or t2 - inside[-1][0] > EDGE_S
                or inside[-1][1] - inside[0][1] < guarantee_Bps * (inside[-1][0] - inside[0][0])):
            res.excluded += 1
            continue
        res.measured += 1
        (s0, b0) = inside[0]
        lag = max(0.0, max(guarantee_Bps * (t - s0) - (n - b0) for t, n in inside))
        edges = (s0 - t1) + (t2 - inside[-1][0])
        longest = max(y[0] - x[0] for x, y in zip(inside, inside[1:]))
        sent = b.classes[cid].bytes - a.classes[cid].bytes
        floor = guarantee_Bps * (t2 - t1 - edges - longest) - lag - b.classes[cid].buffer_bytes - slack_bytes
        if sent < floor:
            res.short.append(f"{t1:.2f}..{t2:.2f}: sent {sent} B, the guarantee is {floor:.0f} B "
                             f"(offered {inside[-1][1] - b0} B in {inside[-1][0] - s0:.2f} s, lag {lag:.0f} B)")
        res.lags.append(lag)
    return res


def window_rates(samples: list[Sample], cid: int) -> tuple[float, float]:
    """(lowest, highest) Mbit/s class ``cid`` sent over the 1 s windows (narrow and wide interval): a summary for
    the test's report, never asserted."""
    rates = [(b.classes[cid].bytes - a.classes[cid].bytes) * 8 / 1e6 for a, b in windows(samples)
             if cid in a.classes and cid in b.classes]
    spans = [(b.t_before - a.t_after, b.t_after - a.t_before) for a, b in windows(samples)
             if cid in a.classes and cid in b.classes]
    if not rates:
        return 0.0, 0.0
    return (min(r / w for r, (_, w) in zip(rates, spans)), max(r / n for r, (n, _) in zip(rates, spans)))


def tree_gaps(samples: list[Sample], want: tuple) -> list[str]:
    """Samples where the enforcing objects were not exactly ``want`` (missing, reverted, changed, unreadable)."""
    return [f"{s.t_before:.2f}: {s.error or ('no shaperd tree: ' + repr(s.tree)[:300])}"
            for s in samples if s.tree != want]


def counter_resets(samples: list[Sample]) -> list[str]:
    """Classes whose byte counter went backwards between samples: the class was deleted and made again."""
    out, last = [], {}
    for s in samples:
        for cid, c in s.classes.items():
            if cid in last and c.bytes < last[cid]:
                out.append(f"{s.t_before:.2f}: class {cid:#x} bytes {last[cid]} -> {c.bytes}")
            last[cid] = c.bytes
    return out


# -- the bed -------------------------------------------------------------------------------------
class UpgradeBed:
    DEADLINE_S = 300.0  # any process here; the test itself takes about a minute

    def __init__(self, tag: str):
        self.nets = netns.Namespaces(stop_grace_s=0)
        self.node, self.peer = f"{tag}-node", f"{tag}-peer"
        self.work = Path(tempfile.mkdtemp(prefix="shaperd-upgrade-"))
        self.cfg = self.work / "tenants.json"
        self.daemon: subprocess.Popen | None = None
        self.daemon_log: Path | None = None
        self.senders: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.runs = 0

    def build(self) -> "UpgradeBed":
        self.nets.add(self.node)
        self.nets.add(self.peer)
        netns.veth("up0", self.node, "up1", self.peer)
        netns.addr(self.node, "up0", "198.18.0.1/24", *(f"{a}/24" for a in NODE_SRC.values()))
        netns.addr(self.peer, "up1", f"{PEER}/24")
        netns.neigh(self.node, "up0", PEER, netns.link(self.peer, "up1")["address"])  # no ARP in the counters
        self.cfg.write_text(json.dumps(config()))
        return self

    # daemons
    def start(self, rel: Release, metrics_port: int) -> subprocess.Popen:
        self.runs += 1
        self.daemon_log = self.work / f"daemon-{self.runs}-{rel.name}.log"
        with open(self.daemon_log, "w") as log:
            # Global options before the subcommand: the form every release has.
            self.daemon = self.nets.spawn(
                rel.argv("--log-json", "run", "--config", str(self.cfg), "--no-kubernetes",
                         "--metrics-address", f"127.0.0.1:{metrics_port}", "--resync-interval", "30"),
                self.node, deadline_s=self.DEADLINE_S, stdout=log, stderr=subprocess.STDOUT, env=rel.env,
                cwd=str(self.work))
        return self.daemon

    def log_lines(self) -> list[dict]:
        out = []
        for line in (self.daemon_log.read_text() if self.daemon_log else "").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line})
        return out

    def first_reconcile(self, deadline_s: float = 120.0) -> dict:
        """The running daemon's first "reconciled" log line (waited for with a deadline)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            got = [l for l in self.log_lines() if l.get("event") == "reconciled"]
            if got:
                return got[0]
            if self.daemon.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no reconcile logged by the daemon within {deadline_s} s; its log:\n"
                             + (self.daemon_log.read_text()[-3000:] if self.daemon_log else ""))

    def sigterm(self, timeout_s: float = 30.0) -> int:
        """SIGTERM the daemon (ip netns exec execs: the group's leader is shaperd) and wait for it to exit."""
        p, self.daemon = self.daemon, None
        os.killpg(p.pid, signal.SIGTERM)
        try:
            return p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            raise AssertionError(f"shaperd did not exit within {timeout_s} s of SIGTERM")
        finally:
            self.nets.procs.forget(p)

    def scrape(self, port: int, times: int = 1, deadline_s: float = 60.0) -> list[str]:
        """``times`` scrapes of /metrics in the node namespace, 0.5 s apart, by one Python in the namespace that
        retries until the listener answers (within ``deadline_s``)."""
        r = netns.run([PY, "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics", str(times), str(deadline_s)],
                      self.node, check=False, timeout=deadline_s + 30)
        if r.returncode != 0:
            raise AssertionError(f"scrape /metrics on 127.0.0.1:{port} in {self.node}: {r.stderr[-1000:]}")
        return json.loads(r.stdout)

    # traffic
    def start_senders(self, seconds: float) -> None:
        for tenant, mbit in OFFER_MBIT.items():
            out = self.work / f"sender-{tenant}.txt"
            with open(out, "w") as f:
                p = self.nets.spawn([PY, "-c", SENDER, NODE_SRC[tenant], PEER, str(mbit), str(seconds), str(PAYLOAD)],
                                    self.node, deadline_s=seconds + 60, stdout=f, stderr=subprocess.STDOUT)
            self.senders[tenant] = (p, out)

    def offered(self, tenant: str) -> list[tuple[float, int]]:
        out = []
        for line in self.senders[tenant][1].read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                try:
                    out.append((float(parts[0]), int(parts[1])))
                except ValueError:
                    pass
        return out

    def stop_senders(self) -> None:
        for p, _ in self.senders.values():
            if p.poll() is None:
                procs.kill(p)
            self.nets.procs.forget(p)

    def cleanup(self) -> None:
        try:
            self.nets.cleanup()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
