"""Where the machine's CPU went during one measurement: /proc/stat and the softirq threads.

Owns: a snapshot of the per-CPU jiffy counters in ``/proc/stat`` and of the ``ksoftirqd/N``
threads' CPU time, and the difference of two snapshots as percentages of the wall time
(user, system, softirq, steal, idle per CPU and for the machine). On a 2-vCPU bed a sender
that shares its core with other load offers less than it wants; these figures, beside each
sender's own CPU (iperf3's), tell a starved sender from a shaper that held one back. Steal
is the hypervisor's: time this VM wanted a CPU and did not get one.

Must not: write anything; signal or rank a process (threads are found by ``comm``, only read).
The proc root is a parameter so the unit tests run on a fixture tree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class Snapshot:
    """Jiffies per CPU (``cpu0``...; ``cpu`` is the machine), and the softirq threads' CPU seconds."""

    cpus: dict[str, tuple[int, ...]]
    ksoftirqd_s: float
    clk_tck: int = 100


def _ksoftirqd_seconds(proc: str, clk_tck: int) -> float:
    total = 0
    try:
        entries = os.listdir(proc)
    except OSError:
        return 0.0
    for pid in entries:
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "comm")) as f:
                if not f.read().startswith("ksoftirqd/"):
                    continue
            with open(os.path.join(proc, pid, "stat")) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread went, or an unreadable entry: not ours to explain
        # after "pid (comm)": state is field 3, utime 14, stime 15 -> indexes 11, 12 of the rest
        total += int(rest[11]) + int(rest[12])
    return total / clk_tck


def snapshot(proc: str = "/proc") -> Snapshot:
    """Read ``/proc/stat``'s cpu lines and the ksoftirqd threads' time."""
    try:
        clk = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):  # pragma: no cover - every Linux has it
        clk = 100
    cpus: dict[str, tuple[int, ...]] = {}
    with open(os.path.join(proc, "stat")) as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *vals = line.split()
            nums = tuple(int(v) for v in vals[:len(FIELDS)])
            cpus[name] = nums + (0,) * (len(FIELDS) - len(nums))
    return Snapshot(cpus, _ksoftirqd_seconds(proc, clk), clk)


def delta(a: Snapshot, b: Snapshot) -> dict:
    """Percent of each CPU's time (and the machine's, ``cpu``) per field between *a* and *b*.

    ``busy`` is everything but idle, iowait and steal. ``ksoftirqd_s`` is the softirq threads'
    CPU seconds in between: softirq work the kernel deferred to them rather than doing it in the
    sender's context (they run at nice 0, so other load competes with them).
    """
    out: dict = {"ksoftirqd_s": round(b.ksoftirqd_s - a.ksoftirqd_s, 3)}
    for name, after in b.cpus.items():
        before = a.cpus.get(name)
        if before is None:
            continue
        d = [y - x for x, y in zip(before, after)]
        total = sum(d)
        if total <= 0:
            continue
        pct = {f: round(100.0 * v / total, 1) for f, v in zip(FIELDS, d)}
        pct["busy"] = round(100.0 - pct["idle"] - pct["iowait"] - pct["steal"], 1)
        out[name] = pct
    return out
