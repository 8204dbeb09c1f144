"""Rate parsing and HTB time arithmetic (pure)."""

import pytest
from hypothesis import given, strategies as st

from shaperd.core.units import UnitError, format_rate, parse_rate, tc_rate, ticks_to_bytes, xmit_ticks


@pytest.mark.parametrize(
    "text,bps",
    [
        ("40Gbps", 40 * 10**9),
        ("60Gbps", 60 * 10**9),
        ("400Mbps", 400 * 10**6),
        ("1.5Gbps", 1_500_000_000),
        ("10Kbps", 10_000),
        ("800bps", 800),
        ("40gbit", 40 * 10**9),
        ("40Gbit", 40 * 10**9),
        ("1mibit", 2**20),
        ("5GB/s", 40 * 10**9),
        ("1MiB/s", 8 * 2**20),
        (" 2 Mbps ", 2 * 10**6),
    ],
)
def test_parse_rate_accepts_source_and_tc_spellings(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    "value,fragment",
    [
        ("40gbps", "ambiguous"),  # tc: bytes; the design: bits
        ("40mbps", "ambiguous"),
        ("40", "expected a rate"),
        (40, "expected a rate string"),
        ("40 gigs", "unknown unit"),
        ("0Gbps", "above zero"),
        ("0.1bps", "whole number"),
        (True, "expected a rate string"),
        ("-1Gbps", "expected a rate"),
    ],
)
def test_parse_rate_rejects_with_a_reason(value, fragment):
    with pytest.raises(UnitError, match=fragment):
        parse_rate(value)


@given(st.integers(min_value=1, max_value=10**13))
def test_tc_rate_round_trips(bps):
    assert parse_rate(tc_rate(bps)) == bps


@given(st.integers(min_value=1, max_value=10**6))
def test_format_rate_exact_multiples_round_trip(n):
    for mult in (1, 10**3, 10**6, 10**9):
        s = format_rate(n * mult)
        if not s.endswith("~"):
            assert parse_rate(s) == n * mult


def test_xmit_ticks_is_exact_at_100_gbit():
    # 5 MB at 40 Gbit is exactly 1 ms = 15625 ticks of 64 ns; tc's
    # microsecond truncation would already lose precision at small bursts.
    assert xmit_ticks(5_000_000, 40 * 10**9) == 15625
    assert ticks_to_bytes(15625, 40 * 10**9) == 5_000_000


@given(st.integers(min_value=1514, max_value=10**8), st.integers(min_value=10**6, max_value=4 * 10**11))
def test_ticks_round_trip_loses_less_than_one_tick(size, rate):
    back = ticks_to_bytes(xmit_ticks(size, rate), rate)
    one_tick_bytes = 64 * rate // (8 * 10**9) + 1
    assert abs(back - size) <= one_tick_bytes
