"""Pure measurement logic: iperf3 JSON, ping output, windows and convergence.

Nothing here touches the system, so it is unit-tested on captured fixtures.

Units: rates are bits per second (floats); times are seconds.  *Goodput* is
TCP/UDP payload as counted by the receiver.  *Wire rate* adds the per-packet
Ethernet+IP+TCP header bytes that ``tc`` (HTB/TBF) accounts for, so it is the
rate comparable with a shaping rate (``wire_rate``).
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

# Ethernet (14) + IPv4 (20) + TCP (20) + timestamps (12): the bytes tc counts on
# top of each MSS-sized payload (FCS/preamble/IFG are not seen by tc on veth).
TCP_HEADER_BYTES = 66
UDP_HEADER_BYTES = 14 + 20 + 8


@dataclass(frozen=True)
class Sample:
    """One reporting interval: [start, end) seconds and its rate in bit/s."""

    start: float
    end: float
    bps: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def bits(self) -> float:
        return self.bps * self.seconds


@dataclass
class IperfResult:
    """What the bed keeps from one iperf3 client (+ its server)."""

    protocol: str                 # "TCP" | "UDP"
    streams: int
    duration: float               # seconds measured by the receiver
    received_bps: float           # end.sum_received.bits_per_second (goodput)
    sent_bps: float               # end.sum_sent.bits_per_second
    retransmits: int | None = None
    lost_percent: float | None = None
    mss: int | None = None
    samples: list[Sample] = field(default_factory=list)   # receiver-side intervals
    sender_samples: list[Sample] = field(default_factory=list)
    offset: float = 0.0           # when this client started, relative to the scenario
    # iperf3's end.cpu_utilization_percent: the sender's process (host_total) and the receiver's
    # (remote_total), in % of one CPU. A sender near 100 % offers what it can, not what it wants: at
    # 10 Gbit/s on 2 vCPUs that tells a starved sender from a shaper that held it back.
    sender_cpu_percent: float | None = None
    receiver_cpu_percent: float | None = None

    @property
    def header_bytes(self) -> int:
        return TCP_HEADER_BYTES if self.protocol == "TCP" else UDP_HEADER_BYTES

    def wire_bps(self, bps: float | None = None) -> float:
        """Convert a goodput (default: received_bps) into the rate tc accounts."""
        bps = self.received_bps if bps is None else bps
        return wire_rate(bps, self.mss or 1448, self.header_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol, "streams": self.streams, "duration": self.duration,
            "received_bps": self.received_bps, "sent_bps": self.sent_bps,
            "wire_bps": self.wire_bps(), "retransmits": self.retransmits,
            "lost_percent": self.lost_percent, "mss": self.mss, "offset": self.offset,
            "sender_cpu_percent": self.sender_cpu_percent, "receiver_cpu_percent": self.receiver_cpu_percent,
            "samples": [[round(s.start, 4), round(s.end, 4), round(s.bps)] for s in self.samples],
        }


def wire_rate(goodput_bps: float, payload: int = 1448, header: int = TCP_HEADER_BYTES) -> float:
    """Rate as tc sees it for a goodput carried in *payload*-byte segments."""
    return goodput_bps * (payload + header) / payload


def _load(doc: str | bytes | dict) -> dict:
    if isinstance(doc, dict):
        return doc
    d = json.loads(doc)
    if not isinstance(d, dict):
        raise ValueError("iperf3 JSON is not an object")
    return d


class IperfError(RuntimeError):
    """iperf3 reported an error (its JSON carries an "error" key)."""


def samples_from(doc: dict) -> list[Sample]:
    """The ``intervals[].sum`` series of one iperf3 JSON document."""
    out = []
    for iv in doc.get("intervals", []):
        s = iv.get("sum") or {}
        if "start" in s and "end" in s and s.get("end", 0) > s.get("start", 0):
            if s.get("omitted"):
                continue
            out.append(Sample(float(s["start"]), float(s["end"]), float(s.get("bits_per_second", 0.0))))
    return out


def parse_iperf(client: str | bytes | dict, server: str | bytes | dict | None = None) -> IperfResult:
    """Parse a client's ``-J`` output (and optionally its server's).

    Goodput is the receiver's figure, ``end.sum_received`` (TCP) or, for UDP,
    ``end.sum_received`` when present else ``end.sum`` corrected for loss.
    Receiver-side samples come from the server's JSON if given, else from the
    client's ``server_output_json`` (``--get-server-output``), else from the
    sender's intervals as a fallback.
    """
    c = _load(client)
    if c.get("error"):
        raise IperfError(str(c["error"]))
    start = c.get("start", {})
    ts = start.get("test_start", {})
    protocol = ts.get("protocol", "TCP")
    end = c.get("end", {})
    recv = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    summ = end.get("sum") or {}
    if recv:
        received = float(recv.get("bits_per_second", 0.0))
        duration = float(recv.get("seconds", recv.get("end", 0.0)))
    else:  # UDP on older iperf3: only "sum", loss from the receiver's report
        lost = float(summ.get("lost_percent", 0.0))
        received = float(summ.get("bits_per_second", 0.0)) * (1 - lost / 100.0)
        duration = float(summ.get("seconds", 0.0))
    sdoc = None
    if server is not None:
        sdoc = _load(server)
        if sdoc.get("error"):
            raise IperfError("server: " + str(sdoc["error"]))
    elif isinstance(c.get("server_output_json"), dict):
        sdoc = c["server_output_json"]
    samples = samples_from(sdoc) if sdoc else []
    sender_samples = samples_from(c)
    return IperfResult(
        protocol=protocol,
        streams=int(ts.get("num_streams", 1)),
        duration=duration,
        received_bps=received,
        sent_bps=float((sent or summ).get("bits_per_second", 0.0)),
        retransmits=sent.get("retransmits"),
        lost_percent=summ.get("lost_percent") if protocol == "UDP" else None,
        mss=start.get("tcp_mss_default") if protocol == "TCP" else ts.get("blksize"),
        samples=samples or sender_samples,
        sender_samples=sender_samples,
        sender_cpu_percent=_cpu(end, "host_total"),
        receiver_cpu_percent=_cpu(end, "remote_total"),
    )


def _cpu(end: dict, key: str) -> float | None:
    v = (end.get("cpu_utilization_percent") or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else None


# ------------------------------------------------------------------ windows
def window_rates(samples: list[Sample], window: float = 1.0, eps: float = 1e-3) -> list[float]:
    """Average rate over every run of consecutive samples spanning ~*window* s.

    Slides by one sample.  A run is kept when it covers at least ``window-eps``
    seconds; with 0.1 s samples and a 1 s window that is every 10-sample run.
    """
    out = []
    n = len(samples)
    for i in range(n):
        bits = 0.0
        secs = 0.0
        for j in range(i, n):
            bits += samples[j].bits
            secs += samples[j].seconds
            if secs >= window - eps:
                out.append(bits / secs)
                break
    return out


def max_window_rate(samples: list[Sample], window: float = 1.0, skip: float = 0.0) -> float | None:
    """Highest *window*-second average, ignoring samples that start before *skip*."""
    rates = window_rates([s for s in samples if s.start >= skip - 1e-9], window)
    return max(rates) if rates else None


def mean_rate(samples: list[Sample], skip: float = 0.0, until: float | None = None) -> float | None:
    """Time-weighted mean over samples in [skip, until)."""
    sel = [s for s in samples if s.start >= skip - 1e-9 and (until is None or s.end <= until + 1e-9)]
    secs = sum(s.seconds for s in sel)
    return sum(s.bits for s in sel) / secs if secs > 0 else None


def convergence_time(samples: list[Sample], threshold_bps: float, hold: float = 0.5) -> float | None:
    """Seconds from the start of *samples* until the rate reaches and holds *threshold*.

    Returns the end time of the first sample from which every *hold*-second
    rolling average (and the sample itself) is >= threshold up to the end of
    the series; None if that never happens.
    """
    n = len(samples)
    for i in range(n):
        if samples[i].bps < threshold_bps:
            continue
        tail = samples[i:]
        rolls = window_rates(tail, hold)
        if all(r >= threshold_bps for r in rolls):
            return samples[i].end - (samples[0].start if samples else 0.0)
    return None


def first_reach(samples: list[Sample], threshold_bps: float) -> float | None:
    """End time of the first sample at or above *threshold* (relative to start)."""
    t0 = samples[0].start if samples else 0.0
    for s in samples:
        if s.bps >= threshold_bps:
            return s.end - t0
    return None


# --------------------------------------------------------------------- ping
_PING_RE = re.compile(r"icmp_seq=(\d+).*?time=([0-9.]+) ms")
_PING_TX_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")


@dataclass
class RttStats:
    """RTT summary of a probe (milliseconds)."""

    sent: int
    received: int
    rtts_ms: list[float]

    def pct(self, p: float) -> float | None:
        return percentile(self.rtts_ms, p)

    @property
    def loss_percent(self) -> float:
        return 100.0 * (self.sent - self.received) / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        r = self.rtts_ms
        return {"sent": self.sent, "received": self.received, "loss_percent": self.loss_percent,
                "min_ms": min(r) if r else None, "p50_ms": self.pct(50), "p90_ms": self.pct(90),
                "p99_ms": self.pct(99), "max_ms": max(r) if r else None,
                "mean_ms": statistics.fmean(r) if r else None}


def parse_ping(text: str) -> RttStats:
    """Parse iputils ``ping`` output into per-probe RTTs and sent/received counts."""
    rtts = [float(m.group(2)) for m in _PING_RE.finditer(text)]
    m = _PING_TX_RE.search(text)
    sent, recvd = (int(m.group(1)), int(m.group(2))) if m else (len(rtts), len(rtts))
    return RttStats(sent, recvd, rtts)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank-interpolated percentile (p in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    k = (len(v) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(values: list[float]) -> dict[str, float | None]:
    """Mean, stdev, min, max of repeated measurements (for noise reporting)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "stdev": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(vals), "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "n": len(vals)}


# ----------------------------------------------------------------------- tc
_CLASS_RE = re.compile(r"^class (\S+) (\S+) ")
_SENT_RE = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


def parse_tc_class_stats(text: str) -> dict[str, dict[str, Any]]:
    """``tc -s class show`` text -> {handle: {kind, bytes, packets, drops, overlimits}}.

    (iproute2's ``-j`` output is not JSON for HTB classes in the versions we
    meet, so the bed reads the text form.)
    """
    out: dict[str, dict[str, Any]] = {}
    cur: str | None = None
    for line in text.splitlines():
        m = _CLASS_RE.match(line)
        if m:
            cur = m.group(2)
            out[cur] = {"kind": m.group(1), "bytes": 0, "packets": 0, "drops": 0, "overlimits": 0}
            continue
        m = _SENT_RE.search(line)
        if m and cur is not None:
            out[cur].update(bytes=int(m.group(1)), packets=int(m.group(2)), drops=int(m.group(3)),
                            overlimits=int(m.group(4)))
            cur = None
    return out
