"""The per-pod bandwidth annotations: the values and the rates (or the refusal reasons) they give.

The table holds the test cases of the two implementations operators move from, where they concern the
value, so a pod annotated for them means the same to shaperd:

- Kubernetes ``pkg/util/bandwidth/utils_test.go`` (``TestExtractPodBandwidthResources``): "10M", "4M",
  "20M" are read; "foo" is an error; a pod with neither annotation has no caps.
- the kubelet's ``validateBandwidthIsReasonable`` bounds (``pkg/util/bandwidth/utils.go``: 1k..1P), with the
  cases of ovn-org/ovn-kubernetes ``go-controller/pkg/cni/bandwidth_test.go``, which tests its copy of it:
  "0.5k" too small, "2P" too large, "1.2k" read as 1200.
- the CNI bandwidth plugin (containernetworking/plugins ``plugins/meta/bandwidth/bandwidth_config_test.go``,
  ``bandwidth_measure_linux_test.go``, ``main.go`` ``validateRateAndBurst``): it takes the kubelet's integer
  bit/s. Rate 0 means "no limit" there and a burst with rate 0 is refused; 8, 16 and 123 bit/s (its config
  tests) are below the kubelet's 1k bound, so no pod ever reached the plugin with them; 5000 and 8000 bit/s
  (its validation and measure tests) are read.

And apimachinery's ``resource.ParseQuantity`` grammar (``pkg/api/resource/quantity.go``, ``suffix.go``):
suffixes n u m k M G T P E and Ki..Ei, "1E" one exa but "1E3" a thousand, no blanks around the value.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
import math

import pytest
from hypothesis import given, settings, strategies as st

from shaperd.core.config import load_text
from shaperd.core.inventory import Inventory, Link, Pod
from shaperd.core.podcaps import (EGRESS_ANNOTATION, INGRESS_ANNOTATION, MAX_BPS, MIN_BPS, REASONS, AnnotationError,
                                  InvalidAnnotation, NotAString, PodCap, parse_bandwidth, pod_caps, shown)
from shaperd.core.tenancy import tenancy

GBIT = 10**9
LINK = 10 * GBIT  # the table's shaped capacity

# value -> bit/s, or the reason it is refused, on a node shaping 10 Gbit/s.
TABLE = [
    # Kubernetes pkg/util/bandwidth/utils_test.go
    ("10M", 10_000_000),
    ("4M", 4_000_000),
    ("20M", 20_000_000),
    ("foo", "syntax"),
    # validateBandwidthIsReasonable, as ovn-kubernetes bandwidth_test.go tests it
    ("0.5k", "too_small"),
    ("2P", "too_large"),
    ("1.2k", 1200),
    # CNI bandwidth plugin: integer bit/s as the kubelet passes them
    ("0", "zero"),  # "no limit" to the plugin; shaperd refuses a zero cap rather than guess
    ("8", "too_small"), ("16", "too_small"), ("123", "too_small"),
    ("5000", 5000), ("8000", 8000),
    # The bad values
    ("fast", "syntax"),
    ("-5M", "negative"), ("-0.5", "negative"), ("-1e3", "negative"),
    ("-0", "zero"), ("0.0", "zero"), ("0e9", "zero"), ("0Gi", "zero"), ("000", "zero"),
    ("20G", "above_link"), ("10000000001", "above_link"), ("10G", LINK),
    ("100M,200M", "multiple"), ("100M 200M", "multiple"), ("100M;200M", "multiple"), ("10M|20M", "multiple"),
    # Huge exponents: refused without building the number
    ("1e18", "too_large"), ("1e999999999", "too_large"), ("1e99999999999999999999", "too_large"),
    ("1e-999999999999", "too_small"), ("9" * 400, "too_large"), ("0." + "0" * 400 + "1", "too_small"),
    ("1" + "0" * 300 + "e-294", 1_000_000),  # a long mantissa with a small exponent is exact
    # The Quantity grammar
    ("100M", 100_000_000), ("1Gi", 2**30), ("512Ki", 512 * 1024), ("1.5Ki", 1536), ("1.5M", 1_500_000),
    ("2e6", 2_000_000), ("2E6", 2_000_000), ("1E3", 1000), ("1e+3", 1000), ("1E-3", "too_small"),
    ("1E", "too_large"),  # one exa (10^18), not 1 * 10^0
    ("1Ei", "too_large"), ("1.000001P", "too_large"), ("0.000001P", GBIT),
    ("+100M", 100_000_000), ("1.G", GBIT), (".5G", 500_000_000), ("007M", 7_000_000),
    ("1000000000000u", 1_000_000), ("1000000000000000n", 1_000_000), ("1500000m", 1500),
    ("999.5", 1000), ("1000.000000001", 1001),  # rounded up, as Quantity.Value() rounds
    ("1000." + "0" * 40 + "1", 1001),  # exact beyond Decimal's default 28 digits
    ("1K", "syntax"), ("1k ", "syntax"), (" 1k", "syntax"), ("100M\n", "syntax"), ("1 M", "syntax"),
    ("1Mi3", "syntax"), ("1e", "syntax"), ("1e+", "syntax"), ("1e1.5", "syntax"), ("1.5.5", "syntax"),
    (".", "syntax"), ("+", "syntax"), ("-", "syntax"), ("", "syntax"), ("1m1", "syntax"),
    ("100Mbps", "syntax"), ("100Mbit/s", "syntax"), ("1gi", "syntax"), ("١٠M", "syntax"),  # Arabic-Indic digits
    ("100M,", "syntax"), ("fast,slow", "syntax"),
]


@pytest.mark.parametrize("value, expected", TABLE, ids=[repr(v)[:30] for v, _ in TABLE])
def test_the_annotation_table(value, expected):
    """The rows of kubernetes pkg/util/bandwidth/utils_test.go, ovn-kubernetes go-controller/pkg/cni/
    bandwidth_test.go and containernetworking/plugins plugins/meta/bandwidth/bandwidth_config_test.go and
    bandwidth_measure_linux_test.go first (module docstring), then the issue's bad values and the grammar."""
    if isinstance(expected, int):
        assert parse_bandwidth(value, LINK) == expected
    else:
        with pytest.raises(AnnotationError) as ei:
            parse_bandwidth(value, LINK)
        assert ei.value.reason == expected, str(ei.value)
        assert ei.value.reason in REASONS


def test_without_a_known_link_only_the_kubelet_bounds_apply():
    assert parse_bandwidth("2G") == 2 * GBIT
    assert parse_bandwidth("1P") == MAX_BPS
    assert parse_bandwidth("0.001P") == 10**12
    with pytest.raises(AnnotationError, match="above 1 Pbit/s"):
        parse_bandwidth("1.5P")


def test_the_link_itself_is_allowed_and_one_bit_more_is_not():
    assert parse_bandwidth("980M", 980_000_000) == 980_000_000
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth("980000001", 980_000_000)
    assert ei.value.reason == "above_link" and "980000000 bit/s" in str(ei.value)


@pytest.mark.parametrize("value", [100, 1e8, True, None, ["100M"], {"v": "100M"}, b"100M"])
def test_a_value_that_is_not_a_string_is_refused_as_syntax(value):
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth(value, GBIT)
    assert ei.value.reason == "syntax"


def test_a_json_value_that_was_not_a_string_is_refused_not_read_as_a_number():
    """A JSON number 100000000 on the wire is kept as its text, marked NotAString: refused, never 100M."""
    v = NotAString("100000000")
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth(v, GBIT)
    assert ei.value.reason == "syntax" and "not a string on the wire" in str(ei.value)
    assert parse_bandwidth("100000000", GBIT) == 100_000_000  # the string is fine
    assert v != "100000000" and "100000000" != v and v == NotAString("100000000")
    assert hash(v) != hash("100000000") or v != "100000000"
    assert len({v, "100000000"}) == 2


def test_messages_name_the_value_escaped_and_bounded():
    huge = "9" * 100_000
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth(huge, GBIT)
    assert len(str(ei.value)) < 300 and "(100000 characters)" in str(ei.value)
    with pytest.raises(AnnotationError) as ei:
        parse_bandwidth("10M\x1b[2J\nfake log line", GBIT)
    assert "\n" not in str(ei.value) and "\x1b" not in str(ei.value)
    assert shown("x" * 10) == "'xxxxxxxxxx'"


def test_a_huge_value_is_refused_in_bounded_time():
    import time

    for v in ("1" * 200_000, "1e" + "9" * 200_000, "." + "0" * 200_000 + "1", "1" * 100_000 + "e-99990"):
        t = time.monotonic()
        with pytest.raises(AnnotationError):
            parse_bandwidth(v, GBIT)
        assert time.monotonic() - t < 5, v[:20]


# -- the property: whatever is accepted is within the bounds and is ceil(the quantity) ------------------------

_SI = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@st.composite
def quantities(draw):
    """(text, exact value as a Fraction): a quantity built from its parts, valued independently of the parser."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(st.text("0123456789", max_size=22))
    frac = draw(st.none() | st.text("0123456789", max_size=12))
    if not whole and not frac:
        whole = draw(st.text("0123456789", min_size=1, max_size=22))
    number = whole + ("" if frac is None else "." + frac)
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    kind = draw(st.sampled_from(["si", "bin", "exp"]))
    if kind == "si":
        suffix = draw(st.sampled_from(sorted(_SI)))
        value *= Fraction(10) ** _SI[suffix]
    elif kind == "bin":
        suffix = draw(st.sampled_from(sorted(_BIN)))
        value *= 2 ** _BIN[suffix]
    else:
        e = draw(st.integers(-40, 40))
        suffix = draw(st.sampled_from(["e", "E"])) + draw(st.sampled_from(["", "+"] if e >= 0 else [""])) + str(e)
        value *= Fraction(10) ** e
    return sign + number + suffix, (-value if sign == "-" else value)


def expected(value: Fraction, link: int | None):
    if value == 0:
        return "zero"
    if value < 0:
        return "negative"
    if value > MAX_BPS:
        return "too_large"
    bps = math.ceil(value)
    if bps < MIN_BPS:
        return "too_small"
    if link is not None and bps > link:
        return "above_link"
    return bps


@settings(max_examples=400, derandomize=True, deadline=None)
@given(quantities(), st.none() | st.integers(MIN_BPS, 2 * MAX_BPS))
def test_every_accepted_value_is_within_the_bounds_and_is_the_quantity_rounded_up(q, link):
    text, value = q
    want = expected(value, link)
    try:
        got = parse_bandwidth(text, link)
    except AnnotationError as e:
        assert e.reason == want, f"{text!r}: {e}"
        return
    assert got == want, text
    assert MIN_BPS <= got <= min(MAX_BPS, link if link is not None else MAX_BPS)
    assert got == math.ceil(value)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_a_rate_in_bounds_or_a_refusal_with_a_reason(text):
    try:
        bps = parse_bandwidth(text, GBIT)
    except AnnotationError as e:
        assert e.reason in REASONS and str(e)
        return
    assert MIN_BPS <= bps <= GBIT


# -- pod_caps and tenancy: caps per pod, refusals per value, the pod stays in its tenant -----------------------

CFG = """
node: {interfaces: [eth0], capacity: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 200Mbps, bandwidthLimit: 800Mbps, match: {podLabels: {team: a}}}
"""


def pod(uid, egress=None, ingress=None, team="a"):
    return Pod(uid=uid, namespace="ns", name=f"p-{uid}", labels=(("team", team),) if team else (),
               ips=(f"198.18.0.{len(uid)}",), host_ifindex=10, host_ifname=f"veth{uid}",
               egress_bandwidth=egress, ingress_bandwidth=ingress)


def test_pod_caps_keeps_each_valid_direction_and_reports_each_refused_value():
    pods = [pod("u1", egress="100M"), pod("u2", ingress="50M"), pod("u3", egress="fast", ingress="20M"),
            pod("u4", egress="0", ingress="-1"), pod("u5"), pod("u6", egress="100M", team=None)]
    caps, invalid = pod_caps(pods, {"u1": "a", "u2": "a", "u3": "a", "u4": "a", "u5": "a"}, GBIT)
    assert caps == {
        "u1": PodCap("u1", "ns/p-u1", "a", egress_bps=100_000_000),
        "u2": PodCap("u2", "ns/p-u2", "a", ingress_bps=50_000_000),
        "u3": PodCap("u3", "ns/p-u3", "a", ingress_bps=20_000_000),  # the valid direction stays
        "u6": PodCap("u6", "ns/p-u6", None, egress_bps=100_000_000),  # no tenant: capped in the default class
    }
    assert [(i.uid, i.key, i.value, i.reason) for i in invalid] == [
        ("u3", EGRESS_ANNOTATION, "fast", "syntax"),
        ("u4", EGRESS_ANNOTATION, "0", "zero"),
        ("u4", INGRESS_ANNOTATION, "-1", "negative"),
    ]


def test_the_warning_names_the_pod_the_key_and_the_value():
    _, invalid = pod_caps([pod("u3", egress="fast")], {}, GBIT)
    w = invalid[0].warning()
    assert w.startswith(f"pod ns/p-u3: annotation {EGRESS_ANNOTATION}='fast' ignored (syntax):")
    assert "stays in its tenant, uncapped" in w


def test_a_refused_pod_stays_in_its_tenant_uncapped_and_the_others_keep_their_caps():
    cfg = load_text(CFG)
    inv = Inventory(links=(Link(ifindex=2, name="eth0", kind="", speed_bps=GBIT),), pods=(
        pod("good", egress="100M"), pod("bad", egress="fast"), pod("big", egress="5G")))
    t = tenancy(cfg, inv)
    assert t.pod_tenants == {"good": "tenant-a", "bad": "tenant-a", "big": "tenant-a"}
    assert set(t.pod_caps) == {"good"} and t.pod_caps["good"].egress_bps == 100_000_000
    assert {(i.uid, i.reason) for i in t.invalid_annotations} == {("bad", "syntax"), ("big", "above_link")}
    assert set(t.pod_marks) == {"good"}  # only a capped pod gets a mark of its own
    assert all(isinstance(i, InvalidAnnotation) for i in t.invalid_annotations)


def test_above_link_uses_node_capacity_else_the_usable_share_of_the_link():
    inv = Inventory(links=(Link(ifindex=2, name="eth0", kind="", speed_bps=GBIT),), pods=(pod("x", egress="990M"),))
    assert tenancy(load_text(CFG), inv).invalid_annotations == ()  # capacity 1Gbps
    no_cap = load_text(CFG.replace("capacity: 1Gbps", "capacity: null"))
    # 98% of 1 Gbit/s is shaped without node.capacity: 990M is above it.
    assert [i.reason for i in tenancy(no_cap, inv).invalid_annotations] == ["above_link"]


def test_decimal_context_is_not_changed_by_the_parser():
    import decimal

    before = decimal.getcontext().prec
    parse_bandwidth("1" + "0" * 60 + "e-55", GBIT)
    assert decimal.getcontext().prec == before and Decimal(1) / Decimal(3) == Decimal("0.3333333333333333333333333333")
