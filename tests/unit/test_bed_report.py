"""Pure bed logic: the shaperd config the bed writes, hand tc lines, tables."""
import json

import pytest
import yaml

from shaperd_bed import report
from shaperd_bed.scenarios import ScenarioResult, TenantFigure
from shaperd_bed.shaping import fmt_rate, hand_tc_commands, shaperd_config
from shaperd_bed.topology import Bed, BedConfig

LINK = 1e9


def test_fmt_rate_is_exact_si():
    assert fmt_rate(1e9) == "1Gbps"
    assert fmt_rate(400e6) == "400Mbps"
    assert fmt_rate(990e6) == "990Mbps"
    assert fmt_rate(1500) == "1500bps"
    assert fmt_rate(12_500_000) == "12500Kbps"


def test_bed_names_are_unique_per_run_and_short():
    a, b = Bed(BedConfig()), Bed(BedConfig())
    assert a.run_id != b.run_id
    assert set(a.namespaces()).isdisjoint(b.namespaces())
    for name in a.interfaces():
        assert len(name) <= 15 and a.run_id in name


def test_shaperd_config_matches_the_core_format():
    bed = Bed(BedConfig(run_id="abc123"))
    cfg = shaperd_config(bed)
    assert cfg["node"] == {"interfaces": ["up-abc123"], "capacity": "1Gbps", "reserve": "10Mbps"}
    a, b = cfg["tenants"]
    assert a == {"name": "tenant-a", "bandwidthGuarantee": "400Mbps", "bandwidthLimit": "600Mbps",
                 "priority": 100, "match": {"cidrs": ["198.18.1.0/24"]}}
    assert b["bandwidthGuarantee"] == "200Mbps" and b["bandwidthLimit"] == "400Mbps" and b["priority"] == 50
    raised = shaperd_config(bed, capacity_bps=990e6, limits={"a": 990e6, "b": 990e6})
    assert raised["node"]["capacity"] == "990Mbps"
    assert {t["bandwidthLimit"] for t in raised["tenants"]} == {"990Mbps"}
    # it is plain YAML the core's loader can read
    yaml.safe_load(yaml.safe_dump(cfg))


def test_shaperd_config_is_valid_for_the_core_loader():
    config = pytest.importorskip("shaperd.core.config")
    bed = Bed(BedConfig(run_id="abc123"))
    c = config.load_text(yaml.safe_dump(shaperd_config(bed, capacity_bps=990e6,
                                                      limits={"a": 990e6, "b": 990e6})))
    assert [t.name for t in c.tenants] == ["tenant-a", "tenant-b"]


def test_hand_tc_is_the_manual_setup():
    bed = Bed(BedConfig(run_id="abc123"))
    lines = [" ".join(c) for c in hand_tc_commands(bed)]
    assert lines[0] == "tc qdisc add dev up-abc123 root handle 1: htb default 30"
    assert "tc class add dev up-abc123 parent 1:1 classid 1:10 htb rate 400mbit ceil 600mbit prio 1" in lines
    assert "tc class add dev up-abc123 parent 1:1 classid 1:20 htb rate 200mbit ceil 400mbit prio 2" in lines
    assert any("u32 match ip src 198.18.1.0/24 flowid 1:10" in x for x in lines)
    assert any("u32 match ip src 198.18.2.0/24 flowid 1:20" in x for x in lines)
    assert not any("burst" in x or "quantum" in x for x in lines)  # no tuning


def _fig(k, goodput, g=None, lim=None, wants=True, mx=None):
    wire = goodput * 1514 / 1448
    return TenantFigure(k, "TCP", 2, goodput, wire, wire, mx if mx is not None else wire, g, lim, wants)


def _results():
    alone = ScenarioResult("alone", "none", "", LINK, {"a": _fig("a", 950e6), "b": _fig("b", 950e6)})
    tog_none = ScenarioResult("together", "none", "", LINK, {"a": _fig("a", 95e6), "b": _fig("b", 855e6)})
    tog = ScenarioResult("together", "shaperd", "", LINK, {
        "a": _fig("a", 570e6, 400e6, 600e6), "b": _fig("b", 380e6, 200e6, 400e6, mx=420e6)})
    pr = ScenarioResult("pressure", "shaperd", "", LINK, {
        "a": _fig("a", 760e6, 400e6, 1e9), "b": _fig("b", 186e6, 200e6, 1e9)})
    conv = ScenarioResult("converge", "shaperd", "", LINK, {"a": _fig("a", 760e6, 400e6, 1e9)},
                          extra={"reach_s": 0.1, "settle_s": 0.3})
    hand = ScenarioResult("together", "hand-tc", "", LINK, {}, error="boom")
    return [alone, tog_none, tog, pr, conv, hand]


def test_source_rows_percent_of_alone():
    idx = report.index(_results())
    rows = report.source_rows(idx)
    assert rows[0]["none"]["a"] == pytest.approx(100) and rows[0]["none"]["link"] == pytest.approx(95)
    assert rows[1]["none"]["a"] == pytest.approx(10) and rows[1]["none"]["link"] == pytest.approx(95)
    assert rows[2]["shaperd"]["a"] == pytest.approx(60)
    assert rows[2]["hand-tc"] == {"error": "boom"}
    assert rows[3]["source"] == {"a": 95, "b": 80, "link": 90}


def test_targets_measured_not_asserted():
    idx = report.index(_results())
    t = {x.target: x for x in report.targets(idx, "shaperd")}
    # B got 186e6*1514/1448 = 194.5 Mbit/s L2 of 200: 97.2 % -> missed
    assert t["guarantee"].value == pytest.approx(100 * 186e6 * 1514 / 1448 / 200e6)
    assert t["guarantee"].ok is False and "pressure:b" in t["guarantee"].detail
    assert t["limit"].value == pytest.approx(5.0) and t["limit"].ok is False
    assert t["convergence"].value == 0.3 and t["convergence"].ok is True
    assert t["alone"].value is None


def test_render_has_every_table_and_json_roundtrips():
    res = _results()
    text = report.render(res, link_mbit=1000)
    assert "| each alone | 100 % / 100 % / 50 % |" in text
    assert "| together, with isolation | 90 % / 60 % / 95 % | 60 % / 40 % / 95 % | error |" in text
    assert "MISSED" in text
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.endswith("|")
    doc = report.to_json(res, link_mbit=1000)
    json.dumps(doc)
    assert doc["results"][0]["scenario"] == "alone"
    assert set(doc["targets"]) == {"shaperd", "hand-tc"}
