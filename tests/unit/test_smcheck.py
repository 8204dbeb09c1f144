"""The node-side check of what the SM programmed: mismatch records per port, "not verified: why", metric samples."""

from __future__ import annotations

from pathlib import Path

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma import smcheck
from shaperd.rdma.plan import plan
from shaperd.discovery import rdma
from shaperd.core.inventory import Inventory, RdmaPort
from shaperd.kernel import ib_smp
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node

FIX = Path(__file__).parent / "fixtures" / "smpquery"
CFG = config.load_file(FIX / "tenants.yaml")
EXPECTED = opensm.render(CFG, plan(CFG, Inventory(), tenancy(CFG, Inventory())), {"default": 8, "ca": 4})
IB = RdmaPort(device="mlx5_1", port=1, link_layer="InfiniBand", state="ACTIVE", lid=4)


def observed(sl2vl_file="sl2vl_self.txt", vlarb_file="vlarb_self.txt") -> ib_smp.PortTables:
    (row,) = ib_smp.parse_sl2vl((FIX / sl2vl_file).read_text())
    return ib_smp.PortTables("mlx5_1", 1, row.vls, ib_smp.parse_vlarb((FIX / vlarb_file).read_text()))


def test_the_recorded_hca_port_matches_the_ca_set():
    c = smcheck.compare("mlx5_1", 1, EXPECTED.tables("ca"), observed())
    assert c.ok and c.describe() == "mlx5_1:1: SL2VL and VL arbitration as the tenants file renders them"


def test_the_switches_set_on_an_hca_gives_mismatch_records():
    c = smcheck.compare("mlx5_1", 1, EXPECTED.tables("swe"), observed())
    assert c.verified and not c.ok
    assert c.mismatches == (
        smcheck.Mismatch("sl2vl", 6, 6, 3),
        smcheck.Mismatch("vlarb_low", 2, (3, 13), (3, 77)),
        smcheck.Mismatch("vlarb_low", 3, (6, 64), (0, 0)),
    )
    assert c.describe() == ("mlx5_1:1: 3 mismatch(es): SL6 -> VL3, expected VL6; vlarb_low entry 2: 3:77, "
                            "expected 3:13; vlarb_low entry 3: 0:0, expected 6:64")


def test_port_entries_follow_opensm_blocks():
    t = tuple((i % 15, 1) for i in range(40))
    assert smcheck.port_entries(t[:3], 8) == t[:3] + ((0, 0),) * 5
    assert smcheck.port_entries(t, 8) == t[:8]
    assert smcheck.port_entries(t, 36) == t[:36]  # block 0, then cap % 32 of block 1


def test_a_zero_weight_entry_matches_whatever_its_vl():
    obs = observed()
    vlarb = ib_smp.VlArb(obs.vlarb.port, 8, 8, obs.vlarb.low[:3] + ((5, 0),) * 5, obs.vlarb.high)
    assert smcheck.compare("mlx5_1", 1, EXPECTED.tables("ca"), ib_smp.PortTables("mlx5_1", 1, obs.sl2vl, vlarb)).ok


def test_check_ports_reads_infiniband_ports_only_and_says_why_not():
    calls = []

    def read(dev, port):
        calls.append((dev, port))
        if dev == "mlx5_7":
            raise ib_smp.SmpError("smpquery not found (install infiniband-diags)")
        return observed()

    ports = [IB, RdmaPort("mlx5_0", 1, "Ethernet", state="ACTIVE"), RdmaPort("mlx5_5", 1, "InfiniBand", state="DOWN"),
             RdmaPort("mlx5_7", 1, "InfiniBand", state="ACTIVE", lid=7),
             RdmaPort("mlx5_8", 1, "InfiniBand", state="ACTIVE", lid=None)]
    checks = smcheck.check_ports(ports, EXPECTED.tables("ca"), read)
    assert calls == [("mlx5_1", 1), ("mlx5_7", 1)]  # RoCE has no SM; a DOWN port or one without a LID: not queried
    assert [c.describe() for c in checks] == [
        "mlx5_1:1: SL2VL and VL arbitration as the tenants file renders them",
        "mlx5_5:1: not verified: port is DOWN; the SM programs active ports",
        "mlx5_7:1: not verified: smpquery not found (install infiniband-diags)",
        "mlx5_8:1: not verified: no LID assigned; the SM has not swept this port",
    ]
    assert smcheck.metric_samples(checks) == [
        smcheck.Sample("shaperd_rdma_sm_tables_verified", {"device": "mlx5_1", "port": "1"}, 1.0),
        *(smcheck.Sample("shaperd_rdma_sm_table_mismatches", {"device": "mlx5_1", "port": "1", "table": t}, 0.0)
          for t in ("sl2vl", "vlarb_high", "vlarb_low")),
    ]  # no series at all where nothing could be read: never a fake 0 or 1
    bad = smcheck.compare("mlx5_1", 1, EXPECTED.tables("swe"), observed())
    assert smcheck.metric_samples([bad]) == [
        smcheck.Sample("shaperd_rdma_sm_tables_verified", {"device": "mlx5_1", "port": "1"}, 0.0),
        *(smcheck.Sample("shaperd_rdma_sm_table_mismatches", {"device": "mlx5_1", "port": "1", "table": t}, n)
          for t, n in (("sl2vl", 1.0), ("vlarb_high", 0.0), ("vlarb_low", 2.0))),
    ]


def test_node_checks_on_the_mlx5_fixture_node(tmp_path):
    devs, notes = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    inv = Inventory(rdma=devs, rdma_notes=notes)
    seen = []
    checks = smcheck.node_checks(CFG, inv, plan(CFG, inv, tenancy(CFG, inv)),
                                 lambda d, p: seen.append((d, p)) or observed(), {"default": 8, "ca": 4})
    assert seen == [("mlx5_1", 1)] and [c.ok for c in checks] == [True]  # the IB HCA; the RoCE PF and VFs skipped
    bad = smcheck.node_checks(CFG, inv, plan(CFG, inv, tenancy(CFG, inv)), lambda d, p: observed(), 16)
    assert [c.describe() for c in bad] == [
        "mlx5_1:1: not verified: no expected tables: --max-vls default: expected 1-15 data VLs, got 16"]
