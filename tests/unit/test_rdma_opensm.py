"""The OpenSM QoS renderer: SL -> VL, the arbitration tables and their weights, and OpenSM's limits.

Golden cases pin the mapping docs/rdma.md documents; property tests check the
invariants for any tenants file: every weight 1-255, in proportion to the
guarantees, SL2VL 16 data VLs and never VL15, every mapped VL served by an
arbitration table, the output accepted by validate(), and independent of
the order of the tenants in the file.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma.plan import plan
from shaperd.core.inventory import Inventory
from shaperd.core.tenancy import tenancy

FOUR = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
  - {name: tenant-c, bandwidthGuarantee: 10Gbps, priority: 10}
  - {name: tenant-d, bandwidthGuarantee: 5Gbps, priority: 5, rdma: {serviceLevel: 6}}
"""


def render(text: str, max_vls=opensm.DEFAULT_MAX_VLS) -> opensm.OpenSmConfig:
    cfg = config.load_text(text)
    inv = Inventory()
    return opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), max_vls)


def test_four_tenants_golden():
    out = render(FOUR, {"default": 8, "ca": 4})
    assert out.options() == [
        ("qos", "TRUE"),
        ("qos_max_vls", "8"),
        ("qos_high_limit", "1"),  # tenant-a has 40 of 76 Gbit/s guaranteed: f/(1-f) = 1.1
        ("qos_vlarb_high", "0:64"),
        ("qos_vlarb_low", "1:255,2:128,3:13,6:64"),  # 20 : 10 : 1 (reserve) : 5 Gbit/s
        ("qos_sl2vl", "0,1,2,3,3,3,6,3,3,3,3,3,3,3,3,3"),  # unused SLs on VL3, the first free VL
        ("qos_ca_max_vls", "4"),
        ("qos_ca_vlarb_low", "1:255,2:128,3:77"),  # tenant-d (5) and no tenant (1) share VL3
        ("qos_ca_sl2vl", "0,1,2,3,3,3,3,3,3,3,3,3,3,3,3,3"),  # SL6 folded into rank 3's VL3
    ]
    assert out.tables("swe") == out.tables("sw0") == out.tables() and out.tables("ca").max_vls == 4
    assert any("no free data VL" in w and "tenant-d" in w for w in out.warnings)
    text = out.text()
    assert text.startswith(opensm.BEGIN_MARK) and text.endswith(opensm.END_MARK + "\n")
    assert "#   VL6 low weight 64: tenant-d (SL6)" in text
    assert "#   VL3 low weight 77: tenant-d (SL6), traffic of no tenant" in text


def test_two_tenants_coarse_weights_and_the_high_table():
    out = render("""
node: {reserve: 20Gbps}
tenants:
  - {name: a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: b, bandwidthGuarantee: 40Gbps, priority: 50}
  - {name: c, bandwidthGuarantee: 20Gbps, priority: 50}
""")
    t = out.tables()
    # b and c share rank 1 and SL1; the default VL gets the reserve: 60 : 20 = 3 : 1, whole 4 KiB packets.
    assert t.vlarb_high == ((0, 64),) and t.vlarb_low == ((1, 192), (2, 64))
    assert t.sl2vl == (0, 1) + (2,) * 14
    assert t.high_limit == 1  # 40 of 120


def test_one_priority_level_has_no_high_table():
    out = render("""
tenants:
  - {name: a, bandwidthGuarantee: 30Gbps, priority: 7}
  - {name: b, bandwidthGuarantee: 10Gbps, priority: 7, rdma: {serviceLevel: 2}}
""")
    t = out.tables()
    assert t.vlarb_high == () and t.high_limit == 0
    assert out.options()[3] == ("qos_vlarb_high", "0:0")
    # Reserve: 1 % of the guarantees (no capacity given) = 0.4 Gbit/s on VL1, the first free VL.
    assert t.sl2vl == (0, 1, 2) + (1,) * 13
    assert dict(t.vlarb_low) == {0: 255, 1: 3, 2: 85}


def test_more_ranks_than_vls_are_grouped_and_unused_sls_join_the_lowest():
    text = "tenants:\n" + "".join(f"  - {{name: t{i}, bandwidthGuarantee: 1Gbps, priority: {100 - i}}}\n"
                                  for i in range(6))
    t = render(text, 4).tables()
    assert t.sl2vl == (0, 1, 2, 3, 3, 3) + (3,) * 10  # SL3-5 (ranks 3-5) and no tenant share VL3
    assert dict(t.vlarb_low) == {1: 64, 2: 64, 3: 192}  # 1 : 1 : 3.06 Gbit/s (a 1 % reserve on VL3): packets


def test_one_data_vl():
    t = render(FOUR, 1).tables()
    assert t.sl2vl == (0,) * 16 and t.vlarb_high == () and t.vlarb_low == ((0, 64),) and t.high_limit == 0


def test_an_explicit_sl_beyond_the_vls_folds_to_its_rank():
    assert opensm.sl_to_vl(6, 3, 4) == 3 and opensm.sl_to_vl(6, 0, 4) == 0 and opensm.sl_to_vl(2, 3, 4) == 2


def test_bad_vl_counts_are_refused():
    with pytest.raises(opensm.OpenSmConfigError, match=r"--max-vls default: expected 1-15 data VLs, got 16"):
        render(FOUR, 16)
    with pytest.raises(opensm.OpenSmConfigError, match=r"unknown port type 'rtr'"):
        render(FOUR, {"rtr": 4})


@pytest.mark.parametrize("key,value,problem", [
    ("qos_sl2vl", "0,1,2", "expected exactly 16 VLs"),
    ("qos_sl2vl", "0,1,15" + ",0" * 13, "SL 2 mapped to VL15, the management VL"),
    ("qos_sl2vl", "0,1,x" + ",0" * 13, "expected VL numbers 0-14, got 'x'"),
    ("qos_sl2vl", "0,1,9" + ",0" * 13, "qos_sl2vl: VL9 is not one of the 8 data VLs"),
    ("qos_vlarb_low", "1:256", "weight 256 out of range; expected 0-255"),
    ("qos_vlarb_low", "15:64", "VL 15 out of range; expected a data VL 0-14"),
    ("qos_vlarb_low", "1-64", "expected VL:weight such as 1:64"),
    ("qos_vlarb_low", ",".join(["1:1"] * 65), "65 VL:weight pairs; OpenSM takes at most 64"),
    ("qos_vlarb_low", "1:0", "VL1 (SL 1) has no weight in either arbitration table"),
    ("qos_max_vls", "0", "qos_max_vls: expected a whole number 1-15"),
    ("qos_high_limit", "256", "qos_high_limit: expected a whole number 0-255"),
    ("qos", "FALSE", "qos: expected TRUE"),
    ("qos_rtr_sl2vl", "0" + ",0" * 15, "not a QoS option shaperd renders"),
])
def test_validate_names_the_key_and_the_limit(key, value, problem):
    opts = dict(render(FOUR).options())
    opts[key] = value
    problems = opensm.validate(list(opts.items()))
    assert any(problem in p for p in problems), problems


def test_validate_checks_each_port_type_with_its_inherited_keys():
    opts = render(FOUR).options() + [("qos_ca_max_vls", "4")]  # the default sl2vl uses VL6
    assert opensm.validate(opts) == ["qos_ca_sl2vl: VL6 is not one of the 4 data VLs of qos_ca_max_vls",
                                     "qos_ca_vlarb_low: VL6 is not one of the 4 data VLs of qos_ca_max_vls"]


def test_validate_accepts_the_rendered_output_and_long_lines_are_refused():
    assert opensm.validate(render(FOUR).options()) == []
    long = render(FOUR).options() + [("qos_ca_vlarb_high", ",".join(["14:255"] * 64) + "," + "0" * 600)]
    assert any("characters; OpenSM reads at most 1022" in p for p in opensm.validate(long))


def test_weights():
    assert opensm.weights({1: 20, 2: 10}) == {1: 128, 2: 64}
    assert opensm.weights({1: 30, 2: 20}) == {1: 192, 2: 128}
    assert opensm.weights({1: 7}) == {1: 64}
    assert opensm.weights({1: 100, 2: 1}) == {1: 255, 2: 3}
    assert opensm.weights({1: 1000, 2: 1}) == {1: 255, 2: 1}  # never 0: a VL without weight is never sent
    assert opensm.weights({}) == {}


# ---------------------------------------------------------------- properties

tenant_st = st.fixed_dictionaries(
    {"g": st.integers(1, 400), "prio": st.integers(0, 12)},
    optional={"sl": st.integers(0, 14)},
)


def tenants_text(ts, reserve_mbps: int | None) -> str:
    node = f"node: {{reserve: {reserve_mbps}Mbps}}\n" if reserve_mbps else ""
    rows = []
    for i, t in enumerate(ts):
        rdma = f", rdma: {{serviceLevel: {t['sl']}}}" if "sl" in t else ""
        rows.append(f"  - {{name: t{i}, bandwidthGuarantee: {t['g']}Gbps, priority: {t['prio']}{rdma}}}\n")
    return node + "tenants:\n" + "".join(rows)


@settings(max_examples=300, deadline=None)
@given(st.lists(tenant_st, min_size=1, max_size=12), st.integers(1, 15), st.one_of(st.none(), st.integers(1, 5000)),
       st.randoms())
def test_invariants_for_any_tenants_file(ts, n, reserve, rnd):
    text = tenants_text(ts, reserve)
    out = render(text, n)
    t = out.tables()
    assert opensm.validate(out.options()) == []
    assert len(t.sl2vl) == 16 and all(0 <= vl < n for vl in t.sl2vl) and opensm.MANAGEMENT_VL not in t.sl2vl
    high, low = dict(t.vlarb_high), dict(t.vlarb_low)
    assert len(high) == len(t.vlarb_high) and len(low) == len(t.vlarb_low)  # each VL once per table
    assert not set(high) & set(low)
    assert set(t.sl2vl) <= {vl for vl, w in (*t.vlarb_high, *t.vlarb_low) if w > 0}  # every SL is served
    assert all(1 <= w <= 255 for w in (*high.values(), *low.values()))
    assert 0 <= t.high_limit <= 254
    # Weights follow the shares: the guarantees of the tenants on each VL (plus the reserve on the default VL).
    cfg = config.load_text(text)
    shares = {lane.vl: sum(x.guarantee_bps for x in cfg.tenants if x.name in lane.tenants) for lane in
              out.default.lanes}
    default = next(lane.vl for lane in out.default.lanes if lane.default)
    shares[default] += opensm._reserve_bps(cfg)
    for table in (high, low):
        if not table:
            continue
        top = max(shares[vl] for vl in table)
        coarse = all(w % 64 == 0 for w in table.values())
        for vl, w in table.items():
            exact = Fraction(shares[vl], top) * (max(table.values()) if coarse else 255)
            assert abs(w - exact) <= (exact * Fraction(1, 20) if coarse else Fraction(1, 2)) or w == 1, (vl, w, exact)
    # Distinct where possible: tenants with distinct SLs below n get distinct VLs.
    sls = out.tenant_sls
    below = {sl for sl in sls.values() if sl < n}
    assert len({t.sl2vl[sl] for sl in below}) == len(below)
    # The order of the tenants in the file changes nothing.
    shuffled = list(enumerate(ts))
    rnd.shuffle(shuffled)
    renamed = "\n".join(tenants_text([x for _, x in shuffled], reserve).splitlines())
    for new_i, (old_i, _) in enumerate(shuffled):
        renamed = renamed.replace(f"name: t{new_i},", f"name: u{old_i},")
    again = render(renamed.replace("name: u", "name: t"), n)
    assert again.options() == out.options()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 14), st.integers(1, 10**12), min_size=1, max_size=15))
def test_weights_properties(shares):
    w = opensm.weights(shares)
    assert set(w) == set(shares) and all(1 <= x <= 255 for x in w.values())
    order = sorted(shares, key=shares.get)
    assert [w[v] for v in order] == sorted(w[v] for v in order)  # a larger share never gets a smaller weight
    if all(x % 64 == 0 for x in w.values()):
        top = max(shares.values())
        k = max(w.values()) // 64
        assert all(abs(Fraction(w[v], 64) - Fraction(k * s, top)) <= Fraction(k * s, top) / 20
                   for v, s in shares.items())


def test_many_tenants_on_one_vl_wrap_their_comment_lines():
    names = [f"tenant-with-a-long-name-{i:02d}-" + "x" * 30 for i in range(60)]
    out = render("tenants:\n" + "".join(f"  - {{name: {n}, bandwidthGuarantee: 1Gbps, priority: 1}}\n" for n in names))
    lines = out.text().splitlines()
    assert all(len(l) <= 116 for l in lines if l.startswith("#   ") or l.startswith("#     "))
    assert sum(n in out.text() for n in names) == 60
