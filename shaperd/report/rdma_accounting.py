"""Per-port RDMA accounting from successive counter reads, pure: totals that never go backwards, rates, saturation.

Owns what "RDMA bytes sent", "rate" and "saturated" mean. Inputs are the
reads of discovery/rdma_counters.py (one PortCounters per port per sample)
and, per port, who owns it (the RDMA plan's ``owners``); time is an
argument, so tests drive it with an injected clock.

For every counter of a port (transmitted bytes = port_xmit_data x 4,
packets, port_xmit_wait, and each hw counter) a ``Track`` keeps:

* **total**: the first value read, then only non-negative deltas added. A
  value below the last one means the counter was reset (perfquery -R, a
  driver reload, a VF handed to a new pod): the new value becomes the
  baseline and that interval adds nothing, so the total never goes down
  and no negative delta exists. Wraps: 64-bit counters (PortCountersExtended,
  hw counters) cannot wrap in practice (2^64 words at 400 Gb/s is millions
  of years), and 32-bit PortCounters do not wrap, they saturate; so a
  decrease is always a reset.
* **saturated**: a counter that may be 32 bits wide and reads 2^32-1 has
  stopped; what it would have counted since is unknown. Its total and rate
  are withheld (None: no series, never a frozen value that reads as zero
  traffic) until it is reset, which starts a new baseline.
* **rate** (per second): total over the last ``rate_window_s`` of samples;
  None until two samples span some time, and None again after a reset or a
  read that failed, until there are two samples again.

A port whose read failed keeps its tracks (the next delta spans the gap:
those bytes were sent) but shows as unreadable, so it has no series.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

BYTES, PACKETS, WAIT = "xmit_bytes", "xmit_packets", "xmit_wait"
# track -> (PortCounters attribute accounted, the raw sysfs value's attribute, the sysfs counter name)
_FIELDS = {BYTES: ("xmit_bytes", "xmit_data_words", "port_xmit_data"),
           PACKETS: ("xmit_packets", "xmit_packets", "port_xmit_packets"),
           WAIT: ("xmit_wait", "xmit_wait", "port_xmit_wait")}
HW_PREFIX = "hw:"


class Counters(Protocol):
    """The fields of a discovery.rdma_counters.PortCounters this module reads."""

    xmit_bytes: int | None
    xmit_data_words: int | None
    xmit_packets: int | None
    xmit_wait: int | None
    hw: Mapping[str, int]
    notes: tuple[str, ...]
    has_counters_dir: bool

    def saturated(self, counter: str, value: int | None) -> bool: ...


@dataclass(frozen=True)
class PortTarget:
    """A port to account for: who owns it (None: no tenant) and its link layer."""

    device: str
    port: int
    tenant: str | None = None
    link_layer: str = ""

    @property
    def ref(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass
class Track:
    """One counter's accumulated total, baseline and rate history."""

    total: int | None = None
    last: int | None = None
    saturated: bool = False
    resets: int = 0
    history: deque = field(default_factory=deque)  # (t, total)
    rate: float | None = None

    def feed(self, t: float, value: int | None, saturated: bool, rate_window_s: float) -> None:
        if value is None:  # this read failed: keep the baseline, the rate is unknown until two reads again
            self.history.clear()
            self.rate = None
            return
        if self.last is None or value < self.last:
            if self.last is not None:
                self.resets += 1  # went down: a reset; the new value is the new baseline
            if self.total is None:
                self.total = value
            self.last, self.saturated = value, saturated
            self.history = deque([(t, self.total)])
            self.rate = None
            return
        if self.saturated:  # stuck at 2^32-1 (or a 64-bit counter moving on from it: still no known delta)
            self.last, self.saturated = value, saturated
            self.history = deque([(t, self.total)])
            self.rate = None
            return
        self.total += value - self.last
        self.last, self.saturated = value, saturated
        if saturated:  # what reached the ceiling counts; nothing after it can
            self.history.clear()
            self.rate = None
            return
        self.history.append((t, self.total))
        while len(self.history) > 2 and t - self.history[1][0] >= rate_window_s:
            self.history.popleft()
        t0, v0 = self.history[0]
        self.rate = (self.total - v0) / (t - t0) if t > t0 else None

    @property
    def shown_total(self) -> int | None:
        return None if self.saturated else self.total


@dataclass(frozen=True)
class RdmaPortSeries:
    """What status, top and the metrics show for one port: totals since first read, rates, state."""

    target: PortTarget
    readable: bool
    bytes_total: int | None = None
    packets_total: int | None = None
    wait_total: int | None = None
    rate_bps: float | None = None  # bits per second
    packet_rate_pps: float | None = None
    wait_rate_per_s: float | None = None
    hw_totals: Mapping[str, int] = field(default_factory=dict)
    hw_rates_per_s: Mapping[str, float] = field(default_factory=dict)
    saturated: tuple[str, ...] = ()  # sysfs counter names stuck at 2^32-1

    @property
    def rate_Bps(self) -> float | None:
        """The exported rate: bytes per second (the Prometheus base unit)."""
        return None if self.rate_bps is None else self.rate_bps / 8
    resets: int = 0
    notes: tuple[str, ...] = ()


@dataclass
class _Port:
    target: PortTarget
    tracks: dict[str, Track] = field(default_factory=dict)
    readable: bool = False
    notes: tuple[str, ...] = ()


class RdmaAccumulator:
    """Feeds successive reads through Tracks; no I/O, no threads, no clock of its own."""

    def __init__(self, rate_window_s: float = 2.0):
        self.rate_window_s = rate_window_s
        self.ports: dict[tuple[str, int], _Port] = {}

    def ingest(self, t: float, reads: Mapping[tuple[str, int], Counters | None],
               targets: Mapping[tuple[str, int], PortTarget]) -> None:
        """One sample at monotonic time ``t``: a read (or None: unreadable) per target port."""
        for key in list(self.ports):
            if key not in targets:
                del self.ports[key]  # the port is gone from the node: its figures go with it
        for key, tgt in targets.items():
            p = self.ports.get(key)
            if p is None:
                p = self.ports[key] = _Port(tgt)
            p.target = tgt
            r = reads.get(key)
            if r is None:
                p.readable, p.notes = False, (f"{tgt.ref}: counters unreadable (the port is gone or its files "
                                              "cannot be read)",)
                for tr in p.tracks.values():
                    tr.feed(t, None, False, self.rate_window_s)
                continue
            p.readable, p.notes = True, tuple(r.notes)
            for name, (attr, raw_attr, sysfs_name) in _FIELDS.items():
                value = getattr(r, attr)
                if value is None and name not in p.tracks:
                    continue  # never had this counter (rxe has no counters/): no track, no series
                saturated = r.saturated(sysfs_name, getattr(r, raw_attr))
                p.tracks.setdefault(name, Track()).feed(t, value, saturated, self.rate_window_s)
            for hw_name, value in r.hw.items():
                p.tracks.setdefault(HW_PREFIX + hw_name, Track()).feed(t, value, False, self.rate_window_s)
            for name in [n for n in p.tracks if n.startswith(HW_PREFIX) and n[len(HW_PREFIX):] not in r.hw]:
                p.tracks[name].feed(t, None, False, self.rate_window_s)

    def view(self) -> tuple[RdmaPortSeries, ...]:
        out = []
        for key in sorted(self.ports):
            p = self.ports[key]
            if not p.readable:
                out.append(RdmaPortSeries(p.target, False, notes=p.notes))
                continue
            tr = p.tracks

            def total(name: str) -> int | None:
                return tr[name].shown_total if name in tr else None

            def rate(name: str) -> float | None:
                return tr[name].rate if name in tr else None

            byte_rate = rate(BYTES)
            hw = {n[len(HW_PREFIX):]: t for n, t in tr.items() if n.startswith(HW_PREFIX)}
            saturated = tuple(_FIELDS[n][2] for n in (BYTES, PACKETS, WAIT) if n in tr and tr[n].saturated)
            notes = p.notes + tuple(
                f"{p.target.ref}: {s} is a 32-bit counter stuck at 2^32-1 (the port has no extended counters); "
                "it is not counted until it is reset (perfquery -R)" for s in saturated)
            out.append(RdmaPortSeries(
                target=p.target, readable=True, bytes_total=total(BYTES), packets_total=total(PACKETS),
                wait_total=total(WAIT), rate_bps=None if byte_rate is None else byte_rate * 8,
                packet_rate_pps=rate(PACKETS), wait_rate_per_s=rate(WAIT),
                hw_totals={n: t.total for n, t in sorted(hw.items()) if t.last is not None and t.total is not None},
                hw_rates_per_s={n: t.rate for n, t in sorted(hw.items()) if t.rate is not None},
                saturated=saturated, resets=sum(t.resets for t in tr.values()), notes=notes,
            ))
        return tuple(out)
