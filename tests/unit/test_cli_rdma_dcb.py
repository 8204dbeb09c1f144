"""``shaperd rdma dcb``: planned vs read back per RoCE uplink, read only (a fake device layer; no write is sent)."""

from __future__ import annotations

import dataclasses

from shaperd.core import config
from shaperd.backends.dcb.cli import collect, render
from shaperd.kernel import dcb
from shaperd.core.roots import Roots

from ..rdma_fixture import Node
from .test_dcb_plan import TWO, FakeDcb, cfg_text


def test_planned_read_back_and_what_would_be_written(tmp_path):
    roots = Roots.of(sys=str(Node(tmp_path).build().sys))
    fake = FakeDcb(["ens1f0"])
    fake.states["ens1f0"] = dataclasses.replace(fake.states["ens1f0"], pfc=dcb.Pfc(8, 0b1000),
                                                apps=(dcb.App(5, 46, 5),))
    cfg = config.load_text("node: {capacity: 100Gbps}\n" + cfg_text(TWO))
    st = collect(cfg, roots, client=fake)
    r = st["netdevs"]["ens1f0"]
    assert r["configured"]["tc_bw_pct"] == [40, 40, 20, 0, 0, 0, 0, 0]
    assert r["read"]["tc_bw_pct"] == [0] * 8 and r["pfc_priorities"] == [3]
    assert [w.split(" (")[0] for w in r["would_write"]] == ["set DCB ETS", "set DCB max rates",
                                                            "add DCB APP dscp-prio 24:2 26:1 on ens1f0: missing"]
    assert r["foreign_dscp_prio"] == [[46, 5]]
    assert fake.writes == [], "a read-only command wrote"
    text = render(st)
    assert "tenant a: DSCP 26 -> TC1, share 40 %, max 60000000 kbit/s" in text
    assert "left alone (not shaperd's): dscp-prio [[46, 5]]" in text and "PFC on priorities [3]" in text
