"""Device churn: a burst of interface events on a node while ``shaperd run`` enforces its uplink (issue 14).

The burst (``burst_lines``): veth pairs created (this kernel has no dummy),
renamed, flapped (up, down), then one end moved to the peer namespace or the
pair deleted: five interface commands per device (more kernel events),
through one ``ip -batch`` process. With ``stopped`` the daemon is SIGSTOPped
for the burst, so its event socket surely overflows (ENOBUFS) and the test
sees the agent's answer to lost events: a full resync, not a busy loop.

Shared by the CI test (tests/integration/test_device_churn.py) and the
benchmark (bench/device_churn.py). Uses the kill-anywhere bed
(tests/kill_trials.py) for the node, the reference state and the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from shaperd_bed import netns

from .kill_trials import KillBed, write_atomically

EVENTS_PER_DEVICE = 5


def burst_lines(devices: int, peer: str, tag: int = 0) -> list[str]:
    """``devices`` * 5 ip(8) commands: add, rename, up, down, then move (even) or delete (odd).

    ``tag`` keeps the names of one burst apart from those a previous burst left (moved ends, peers)."""
    out = []
    for i in range(devices):
        n, q, r = f"c{tag}n{i}", f"c{tag}q{i}", f"c{tag}r{i}"
        out += [f"link add {n} type veth peer name {q}", f"link set {n} name {r}", f"link set {r} up",
                f"link set {r} down"]
    for i in range(devices):
        out.append(f"link set c{tag}r{i} netns {peer}" if i % 2 == 0 else f"link del c{tag}r{i}")
    return out


def log_events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class ChurnResult:
    events: int
    overflows: int  # "kernel events were lost" warnings logged after the burst
    resyncs: int  # reconciles after the burst until the daemon was quiet again
    cpu_s: float  # the daemon's CPU time from the burst's start until quiet
    recover_s: float  # burst end until the uplink matched the fresh-apply state and the daemon was quiet
    matches: bool
    rss_kib_before: int
    rss_kib_after: int
    changes_after: int  # kernel changes the daemon made after the burst (the uplink was not touched: 0)


def quiet(log: Path, after: int, deadline_s: float) -> list[dict] | None:
    """The log's events past line ``after`` once the daemon reconciled with the event socket drained.

    Quiet: the last event is a "reconciled" with no change, after at least one reconcile since the burst."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        evs = log_events(log)[after:]
        recs = [e for e in evs if e.get("event") == "reconciled"]
        if recs and evs[-1].get("event") == "reconciled" and evs[-1].get("changes") == 0:
            return evs
        time.sleep(0.05)
    return None


def run_burst(bed: KillBed, devices: int = 200, stopped: bool = True, settle_s: float = 0.0) -> ChurnResult:
    """Daemon enforcing config A; one burst of ``devices`` * 5 events; until the daemon is quiet again.

    ``settle_s`` (benchmark only): after quiet, watch this much longer and count what the daemon still does."""
    write_atomically(bed.cfg_path, bed.cfg_a)
    bed.fresh_device()
    p = bed.start_daemon()
    log = bed.work / f"daemon-{bed.logs}.log"
    if bed.wait_state(bed.ref_a) is None or not bed.wait_reconciled():
        raise RuntimeError("daemon did not reach state A")
    mark = len(log_events(log))
    rss0, cpu0 = rss_kib(p.pid), cpu_s(p.pid)
    if stopped:
        os.kill(p.pid, signal.SIGSTOP)
    try:
        bed.bursts = getattr(bed, "bursts", 0) + 1
        netns.batch(bed.node, burst_lines(devices, bed.peer, bed.bursts), timeout=300)
    finally:
        if stopped:
            os.kill(p.pid, signal.SIGCONT)
    t_end = time.monotonic()
    evs = quiet(log, mark, 120)
    matched = bed.wait_state(bed.ref_a, 30) is not None
    recover = time.monotonic() - t_end
    if settle_s:
        time.sleep(settle_s)  # benchmark: a fixed window to see any busy loop in the counts below
        evs = log_events(log)[mark:]
    evs = evs or []
    res = ChurnResult(
        events=devices * EVENTS_PER_DEVICE,
        overflows=sum(1 for e in evs if "events were lost" in str(e.get("event"))),
        resyncs=sum(1 for e in evs if e.get("event") == "reconciled"),
        cpu_s=cpu_s(p.pid) - cpu0, recover_s=recover, matches=matched,
        rss_kib_before=rss0, rss_kib_after=rss_kib(p.pid),
        changes_after=sum(e.get("changes", 0) for e in evs if e.get("event") == "reconciled"))
    bed.kill_daemon()
    return res
