"""Units: parsing and formatting of rates, and the HTB time arithmetic.

Owns every conversion between what an operator writes (``40Gbps``), what the
kernel stores (bytes per second, psched ticks) and what ``tc`` accepts, so the
writer and the read-back verifier use the same helpers. Pure: no I/O.

Rates are carried inside shaperd as integer **bits per second** (``*_bps``);
sizes as integer **bytes** (``*_bytes``). The kernel's HTB takes bytes per
second; the conversion happens only in :func:`bps_to_Bps`.
"""

from __future__ import annotations

import re
from fractions import Fraction

# SI bit-rate spellings. The capitalised forms are the source design's
# ("40Gbps"); the lower-case *bit forms are tc's. Both mean bits per second.
_BIT_UNITS: dict[str, int] = {
    "bps": 1,
    "Kbps": 10**3,
    "Mbps": 10**6,
    "Gbps": 10**9,
    "Tbps": 10**12,
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    # tc's IEC spellings
    "kibit": 2**10,
    "mibit": 2**20,
    "gibit": 2**30,
    "tibit": 2**40,
}
# Bytes only with an explicit "/s" so nobody gets bytes by accident.
_BYTE_UNITS: dict[str, int] = {
    "B/s": 1,
    "KB/s": 10**3,
    "MB/s": 10**6,
    "GB/s": 10**9,
    "TB/s": 10**12,
    "KiB/s": 2**10,
    "MiB/s": 2**20,
    "GiB/s": 2**30,
    "TiB/s": 2**40,
}
# tc reads these lower-case spellings as BYTES per second, the source design's
# capitalised ones as bits: refusing them is the only way nobody is surprised.
_AMBIGUOUS = {"kbps", "mbps", "gbps", "tbps", "Bps", "KBps", "MBps", "GBps"}

_RATE_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z/]+)\s*$")

# psched ticks: the kernel's HTB "buffer" is in units of 64 ns (PSCHED_SHIFT 6).
PSCHED_TICK_NS = 64
NS_PER_S = 10**9


class UnitError(ValueError):
    """A value that is not a rate we accept; the message says what was expected."""


def parse_rate(value: object) -> int:
    """Parse an operator-written rate into integer bits per second.

    Accepts ``40Gbps`` (SI bits), tc spellings ``40gbit``/``40mibit`` and
    explicit bytes ``5GB/s``. Rejects bare numbers (bits or bytes?), tc's
    ambiguous ``40gbps`` (bytes in tc, bits in the design) and zero.
    """
    if isinstance(value, bool) or not isinstance(value, str):
        raise UnitError(
            f"expected a rate string such as '40Gbps', '400mbit' or '5GB/s', got {value!r}"
        )
    m = _RATE_RE.match(value)
    if not m:
        raise UnitError(f"expected a rate such as '40Gbps', '400mbit' or '5GB/s', got {value!r}")
    num, unit = Fraction(m.group("num")), m.group("unit")
    if unit in _AMBIGUOUS:
        prefix = unit[0].upper() if unit.lower() != "bps" else ""
        n = m.group("num")
        raise UnitError(
            f"{value!r} is ambiguous: tc reads '{unit}' as bytes per second, the tenants file "
            f"as bits; write '{n}{prefix}bps' for bits or '{n}{prefix}B/s' for bytes"
        )
    if unit in _BIT_UNITS:
        bits = num * _BIT_UNITS[unit]
    elif unit.lower() in _BIT_UNITS and unit.lower().endswith("bit"):
        bits = num * _BIT_UNITS[unit.lower()]  # Gbit, Mbit: tc is case-insensitive here
    elif unit in _BYTE_UNITS:
        bits = num * _BYTE_UNITS[unit] * 8
    else:
        known = ", ".join(["bps", "Kbps", "Mbps", "Gbps", "Tbps", "kbit", "mbit", "gbit", "MB/s", "GB/s"])
        raise UnitError(f"unknown unit {unit!r} in {value!r}; expected one of {known}")
    if bits.denominator != 1:
        raise UnitError(f"{value!r} is not a whole number of bits per second")
    if bits <= 0:
        raise UnitError(f"{value!r}: a rate must be above zero")
    return int(bits)


def format_rate(bps: int) -> str:
    """Short exact human form: 40000000000 -> '40Gbps', 1500 -> '1500bps'."""
    for unit, mult in (("Tbps", 10**12), ("Gbps", 10**9), ("Mbps", 10**6), ("Kbps", 10**3)):
        if bps >= mult and bps % mult == 0:
            return f"{bps // mult}{unit}"
    for unit, mult in (("Gbps", 10**9), ("Mbps", 10**6), ("Kbps", 10**3)):
        if bps >= mult:
            return f"{bps / mult:.3f}".rstrip("0").rstrip(".") + unit + "~"
    return f"{bps}bps"


def tc_rate(bps: int) -> str:
    """The exact spelling tc accepts for a rate in bits per second ('40gbit')."""
    for unit, mult in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= mult and bps % mult == 0:
            return f"{bps // mult}{unit}"
    return f"{bps}bit"


def bps_to_Bps(bps: int) -> int:
    """Bits to whole bytes per second, as HTB stores rates (rounded down)."""
    return bps // 8


def xmit_ticks(size_bytes: int, rate_bps: int) -> int:
    """Time to send ``size_bytes`` at ``rate_bps``, in psched ticks (64 ns).

    This is what HTB's ``buffer``/``cbuffer`` hold. Computed exactly in
    integers (tc truncates to whole microseconds first, which at 100 Gbit
    loses several percent of a small burst).
    """
    ns = size_bytes * 8 * NS_PER_S // rate_bps
    return max(1, ns // PSCHED_TICK_NS)


def ticks_to_bytes(ticks: int, rate_bps: int) -> int:
    """Inverse of :func:`xmit_ticks`: the burst in bytes a buffer of ``ticks`` allows."""
    return ticks * PSCHED_TICK_NS * rate_bps // (8 * NS_PER_S)


def format_backlog_ns(ns: int) -> str:
    """A backlog in time (edt: the departure clock ahead of now), as status and top print it."""
    if ns <= 0:
        return "0"
    if ns < 1_000_000:
        return f"{ns / 1000:.0f}us"
    return f"{ns / 1_000_000:.1f}ms"
