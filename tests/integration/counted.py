"""Shaping as the kernel counted it: bytes a class or qdisc sent against the bytes its limit allows.

Pass/fail tests never assert a rate: a machine whose cores are busy sends
less, so a floor on throughput fails for reasons that have nothing to do with
shaping (rates are measured in benchmarks, bench/ and the bed's demo). What a
token bucket guarantees holds at any load: between two readings of its
counters it sent at most ``rate * interval + burst`` (plus one packet, which
HTB and TBF let through on the last token; a GSO packet is up to 64 KiB).
The interval is the widest the readings allow, from just before the first to
just after the second (monotonic clock), so a slow read only loosens the
bound, never breaks it. Whether a class was pressed on its limit is read
from its drop and overlimit counters, never inferred from a rate.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from shaperd.core.units import ticks_to_bytes
from shaperd.kernel.rtnl import RtnlReader

from tests import procs

# One packet past the last token: a full GSO super-packet plus its Ethernet header.
ONE_PACKET_BYTES = 65536 + 14


@dataclass(frozen=True)
class Counted:
    bytes: int
    packets: int
    drops: int
    overlimits: int
    rate_Bps: int  # the bucket's rate: an HTB class's ceil, a TBF's rate
    burst_bytes: int  # the bucket's depth: an HTB class's cburst, a TBF's burst


@dataclass(frozen=True)
class Reading:
    t_before: float
    t_after: float
    counters: dict  # key (an HTB classid, or "root") -> Counted


def htb_classes(netns: str, device: str, run_root: str = "/run") -> Reading:
    """Every HTB class of ``device`` in ``netns``, keyed by classid, read through netlink."""
    t0 = time.monotonic()
    with RtnlReader(netns, run_root=run_root) as r:
        (link,) = [l for l in r.links() if l.name == device]
        rows = r.htb_classes(link.ifindex, device)
    t1 = time.monotonic()
    return Reading(t0, t1, {c.classid: Counted(c.bytes, c.packets, c.drops, c.overlimits, c.ceil_Bps,
                                               ticks_to_bytes(c.cbuffer_ticks, c.ceil_Bps * 8)) for c in rows})


def tbf_root(netns: str, device: str) -> Reading:
    """The root TBF of ``device`` in ``netns`` (``tc -s -j``: iproute2 decodes TBF's rate and burst)."""
    t0 = time.monotonic()
    out = procs.run(["ip", "netns", "exec", netns, "tc", "-s", "-j", "qdisc", "show", "dev", device]).stdout
    t1 = time.monotonic()
    (q,) = [q for q in json.loads(out) if q.get("root")]
    assert q["kind"] == "tbf", q
    o = q["options"]
    return Reading(t0, t1, {"root": Counted(q["bytes"], q["packets"], q["drops"], q["overlimits"], o["rate"],
                                            o["burst"])})


def sent(a: Reading, b: Reading, key) -> int:
    return b.counters[key].bytes - a.counters[key].bytes


def allowed(a: Reading, b: Reading, key) -> float:
    """The most the bucket of ``key`` can have let through between the two readings."""
    c = b.counters[key]
    return c.rate_Bps * (b.t_after - a.t_before) + c.burst_bytes + ONE_PACKET_BYTES


def over_limit(a: Reading, b: Reading, keys=None) -> dict:
    """{key: "sent X B, the limit allows Y B in Z s"} for every key that sent more than its bucket allows."""
    keys = [k for k in (keys if keys is not None else b.counters) if k in a.counters and k in b.counters]
    out = {}
    for k in keys:
        if sent(a, b, k) > allowed(a, b, k):
            out[k] = (f"sent {sent(a, b, k)} B, the limit allows {allowed(a, b, k):.0f} B in "
                      f"{b.t_after - a.t_before:.3f} s")
    return out


def pressed(a: Reading, b: Reading, key) -> bool:
    """The kernel held ``key`` back between the readings: it dropped or counted overlimits."""
    return (b.counters[key].drops > a.counters[key].drops
            or b.counters[key].overlimits > a.counters[key].overlimits)
