"""Per-tenant accounting from successive HTB class samples: the math, and a thread that samples.

Owns what "rate", "borrowed" and "time below guarantee" mean. The kernel
keeps only running counters (bytes, packets, drops, overlimits) and the
instantaneous queue (backlog); everything else is integrated here over the
interval between two samples, so the definitions are only as fine as the
sampling period (``SamplerSettings.period_s``, 0.5 s by default).

Definitions, for one class over one interval ``dt = t1 - t0`` between two
successive samples, with ``sent = bytes1 - bytes0`` and ``g`` the tenant's
guarantee in bytes per second:

* **borrowed bytes** += ``max(0, sent - g * dt)``: what the class sent above
  its guarantee in that interval, i.e. on bandwidth lent by the parent. Over
  many intervals this is the byte volume above the guarantee, at the
  sampling resolution (a burst above and a lull below within one interval
  cancel out).
* **time below guarantee** += ``dt`` when the class *had demand* and
  ``sent < g * dt * (1 - BELOW_MARGIN)``. Demand means the queue was
  non-empty at both ends of the interval: a backlog that persisted, not one
  packet caught in flight. A tenant that sends less than its guarantee
  because it has nothing more to send accrues nothing. Rising overlimits
  alone are deliberately *not* demand: HTB counts them when a class hits its
  ceiling (>= the guarantee), so a short burst at the ceiling followed by
  silence would otherwise count a whole interval as starved (the
  integration test caught exactly that). The margin absorbs the timing
  jitter between the kernel's counters and our clock; a class exactly at a
  ceiling equal to its guarantee is not "below" it.
* **rate** (gauge) = bytes sent over the last ``rate_window_s`` (2 s) of
  samples, in bits per second.

An interval in which a counter went backwards (the class was deleted and
recreated) is skipped; intervals longer than ``max_interval_s`` (the sampler
stalled) are skipped too rather than smeared over a long gap.

Must not: import pyroute2 (samples come from kernel/rtnl via report/status), or
do anything but read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from shaperd.core import log
from shaperd.core.protocol import ClassTarget
from shaperd.core.periodic import Periodic

# Below-guarantee tolerance: 2 % of the guarantee (see module docstring).
BELOW_MARGIN = 0.02


class Counters(Protocol):
    """The fields of a kernel.rtnl_rows.HtbClassRow this module reads."""

    bytes: int
    packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    qlen: int
    rate_Bps: int
    ceil_Bps: int


# What one HTB class on one device is for. ``None`` rates: use the kernel's.
Target = ClassTarget


@dataclass(frozen=True)
class Accrual:
    borrowed_bytes: float = 0.0
    below_guarantee_s: float = 0.0
    counted: bool = False  # False: the interval was skipped (reset, stall, no time)


def accrue(prev: Counters, cur: Counters, dt_s: float, guarantee_bps: float,
           margin: float = BELOW_MARGIN, max_interval_s: float = 5.0) -> Accrual:
    """What one interval adds to the borrowed and below-guarantee counters (pure)."""
    if dt_s <= 0 or dt_s > max_interval_s:
        return Accrual()
    sent = cur.bytes - prev.bytes
    if sent < 0 or cur.overlimits < prev.overlimits:
        return Accrual()  # counters reset: the class was recreated
    allowance = guarantee_bps / 8 * dt_s
    borrowed = max(0.0, sent - allowance)
    demand = prev.qlen > 0 and cur.qlen > 0
    below = dt_s if demand and sent < allowance * (1 - margin) else 0.0
    return Accrual(borrowed, below, True)


@dataclass
class TenantSeries:
    """Everything exported for one (tenant, device): latest kernel counters plus integrals."""

    target: Target
    guarantee_bps: int
    limit_bps: int
    bytes: int = 0
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    qlen: int = 0
    borrowed_bytes: float = 0.0
    below_guarantee_s: float = 0.0
    rate_bps: float | None = None  # None until two samples span some time
    last: Counters | None = field(default=None, repr=False)
    last_t: float = 0.0
    history: deque = field(default_factory=deque, repr=False)  # (t, bytes)

    # The exported values: Prometheus base units are bytes (promtool check metrics warns on bits).
    @property
    def rate_Bps(self) -> float | None:
        return None if self.rate_bps is None else self.rate_bps / 8

    @property
    def guarantee_Bps(self) -> float:
        return self.guarantee_bps / 8

    @property
    def limit_Bps(self) -> float:
        return self.limit_bps / 8

    def copy(self) -> "TenantSeries":
        return TenantSeries(self.target, self.guarantee_bps, self.limit_bps, self.bytes, self.packets, self.drops,
                            self.overlimits, self.backlog_bytes, self.qlen, self.borrowed_bytes,
                            self.below_guarantee_s, self.rate_bps)


@dataclass(frozen=True)
class Snapshot:
    """What a scrape reads: immutable, swapped in whole by the sampler."""

    series: tuple[TenantSeries, ...] = ()
    taken_at: float | None = None  # wall clock of the last successful sample
    ok: bool = False  # the last sample attempt succeeded
    error: str | None = None
    duration_s: float = 0.0
    samples: int = 0
    failures: int = 0


class Accumulator:
    """Feeds successive samples through :func:`accrue`; no I/O, no threads."""

    def __init__(self, rate_window_s: float = 2.0, margin: float = BELOW_MARGIN, max_interval_s: float = 5.0):
        self.rate_window_s = rate_window_s
        self.margin = margin
        self.max_interval_s = max_interval_s
        self.series: dict[tuple[str, int], TenantSeries] = {}

    def ingest(self, t: float, stats: Mapping[tuple[str, int], Counters], targets: Mapping[tuple[str, int], Target]) -> None:
        """One sample at monotonic time ``t``: {(device, classid): counters}; unlabelled classes are ignored."""
        seen = set()
        for key, st in stats.items():
            tgt = targets.get(key)
            if tgt is None:
                continue
            seen.add(key)
            g = tgt.guarantee_bps if tgt.guarantee_bps is not None else st.rate_Bps * 8
            lim = tgt.limit_bps if tgt.limit_bps is not None else st.ceil_Bps * 8
            s = self.series.get(key)
            if s is None or s.target.tenant != tgt.tenant:
                s = self.series[key] = TenantSeries(tgt, g, lim)
            s.target, s.guarantee_bps, s.limit_bps = tgt, g, lim
            if s.last is not None:
                a = accrue(s.last, st, t - s.last_t, g, self.margin, self.max_interval_s)
                s.borrowed_bytes += a.borrowed_bytes
                s.below_guarantee_s += a.below_guarantee_s
                if st.bytes < s.last.bytes:
                    s.history.clear()
            s.history.append((t, st.bytes))
            while len(s.history) > 2 and t - s.history[1][0] >= self.rate_window_s:
                s.history.popleft()
            t0, b0 = s.history[0]
            s.rate_bps = (st.bytes - b0) * 8 / (t - t0) if t > t0 else None
            s.bytes, s.packets, s.drops, s.overlimits = st.bytes, st.packets, st.drops, st.overlimits
            s.backlog_bytes, s.qlen = st.backlog_bytes, st.qlen
            s.last, s.last_t = st, t
        for key in list(self.series):
            if key not in seen:  # class or tenant gone: its series go with it
                del self.series[key]

    def view(self) -> tuple[TenantSeries, ...]:
        return tuple(s.copy() for _, s in sorted(self.series.items(), key=lambda kv: (kv[1].target.tenant, kv[0][0])))


@dataclass(frozen=True)
class SamplerSettings:
    # Resolution of the below-guarantee and borrowed integrals; one netlink
    # dump per shaped device each period (about 1 ms per 64 classes).
    period_s: float = 0.5
    # Window of the rate gauge: long enough to smooth HTB's bursts, short
    # enough to show a change within a scrape interval.
    rate_window_s: float = 2.0
    # A longer gap between samples is not integrated (stalled sampler).
    max_interval_s: float = 5.0


class Sampler(Periodic):
    """Background thread: read class stats every period, publish a Snapshot.

    ``read`` returns {(device, classid): counters} (report.status.sample on
    a netlink socket the thread owns); ``targets`` is swapped by the daemon
    after each reconcile.
    """

    thread_name = "shaperd-sampler"

    def __init__(self, read: Callable[[], Mapping[tuple[str, int], Counters]],
                 settings: SamplerSettings = SamplerSettings(), clock=time.monotonic, wall=time.time):
        self.read = read
        self.settings = settings
        self.acc = Accumulator(settings.rate_window_s, max_interval_s=settings.max_interval_s)
        self.targets: Mapping[tuple[str, int], Target] = {}
        self.snapshot = Snapshot()
        self.clock, self.wall = clock, wall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = log.get("shaperd.sampler")
        self._failing = False

    def set_targets(self, targets: Mapping[tuple[str, int], Target]) -> None:
        self.targets = dict(targets)  # one reference swap: the thread sees old or new, never half

    def sample_once(self) -> Snapshot:
        start = self.clock()
        prev = self.snapshot
        try:
            stats = self.read()
        except Exception as e:  # noqa: BLE001 - any failure becomes status, never a dead thread
            if not self._failing:
                self.log.error("sample failed", error=str(e))
            self._failing = True
            self.snapshot = Snapshot(prev.series, prev.taken_at, False, str(e), self.clock() - start,
                                     prev.samples, prev.failures + 1)
            return self.snapshot
        if self._failing:
            self.log.info("sampling recovered")
        self._failing = False
        t = self.clock()
        self.acc.ingest(t, stats, self.targets)
        self.snapshot = Snapshot(self.acc.view(), self.wall(), True, None, t - start, prev.samples + 1, prev.failures)
        return self.snapshot

