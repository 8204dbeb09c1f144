"""``shaperd rdma status`` and the RDMA rows of ``status``/``top`` on a fixture mlx5 node (no RDMA hardware)."""

from __future__ import annotations

import json
import shutil

import pytest

from shaperd.cli import main as cli
from shaperd.kernel import rdma_nl
from shaperd.report import rdma_status, rdma_view, top
from shaperd.core.roots import Roots

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_1:1"]}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    rdma: {devices: ["0000:3b:00.2"], serviceLevel: 3, trafficClass: 106}
"""


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path).build()
    (tmp_path / "t.yaml").write_text(CFG)
    return n


def collect(node, tmp_path, **kw):
    clock = iter([100.0, 100.5])

    def sleep(_s):  # traffic happens while status waits: 1e6 words on tenant-a's HCA, 3 CNPs on tenant-b's VF
        node.set_counter("mlx5_1", 1, "port_xmit_data", 1_000_000)
        node.set_counter("mlx5_1", 1, "port_xmit_packets", 500)
        node.set_counter("mlx5_2", 1, "np_cnp_sent", 3, hw=True)

    return rdma_status.collect(Roots.of(sys=str(node.sys)), str(tmp_path / "t.yaml"), 0.5, sleep=sleep,
                               clock=lambda: next(clock), **kw)


def ports(status):
    return {f"{p['device']}:{p['port']}": p for d in status["devices"] for p in d["ports"]}


def test_devices_ports_owners_sl_tc_and_rates_over_the_interval(node, tmp_path):
    st = collect(node, tmp_path)
    p = ports(st)
    assert st["window_s"] == 0.5 and sorted(p) == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    a, b, free = p["mlx5_1:1"], p["mlx5_2:1"], p["mlx5_0:1"]
    assert (a["tenant"], a["service_level"], a["link_layer"], a["lid"], a["sm_lid"]) == ("tenant-a", 0, "InfiniBand", 4, 1)
    assert (b["tenant"], b["service_level"], b["traffic_class"], b["dscp"], b["netdevs"]) == \
        ("tenant-b", 3, 106, 26, ["ens1f0v0"])
    assert free["tenant"] is None and free["service_level"] is None and free["roce_v2_gid_index"] == 3
    assert a["counters"]["bytes"] == 4_000_000 and a["counters"]["rate_bps"] == 4_000_000 * 8 / 0.5
    assert a["counters"]["packet_rate_pps"] == 1000
    assert b["hw_counters"]["np_cnp_sent"] == {"total": 3, "rate_per_s": 6.0}
    dev = next(d for d in st["devices"] if d["name"] == "mlx5_2")
    assert (dev["pci"], dev["is_vf"], dev["pf_pci"]) == ("0000:3b:00.2", True, "0000:3b:00.0")
    assert all("sm_check" not in x for x in p.values())  # no check ran: no field, not a made-up value
    text = rdma_status.render(st)
    assert "SM TABLES" not in text and "tenant-a" in text and "np_cnp_sent=3" in text


def test_the_subnet_manager_check_has_its_own_field_and_column_when_it_ran(node, tmp_path):
    st = collect(node, tmp_path, sm_check=lambda port: {"ok": port.device != "mlx5_1"} if port.link_layer ==
                 "InfiniBand" else None)
    p = ports(st)
    assert p["mlx5_1:1"]["sm_check"] == {"ok": False} and "sm_check" not in p["mlx5_0:1"]
    text = rdma_status.render(st)
    row = next(l for l in text.splitlines() if l.startswith("mlx5_1"))
    assert "SM TABLES" in text.splitlines()[0] and row.rstrip().endswith("MISMATCH")


def test_what_cannot_be_read_is_unknown_and_said_so(node, tmp_path):
    shutil.rmtree(node.sys / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters")
    (node.sys / "module" / "ib_core" / "parameters" / "netns_mode").write_text("N\n")
    st = collect(node, tmp_path)
    free = ports(st)["mlx5_0:1"]
    assert free["counters"]["bytes"] is None and free["counters"]["rate_bps"] is None
    assert any("no counters/ directory" in n for n in free["notes"])
    assert any("netns mode is exclusive" in n for n in st["notes"])
    text = rdma_status.render(st)
    assert "note: mlx5_0:1: no counters/ directory" in text
    (tmp_path / "t.yaml").write_text("tenants: [")
    st = collect(node, tmp_path)
    assert all(x["tenant"] is None for x in ports(st).values())
    assert any("not a readable tenants file" in n for n in st["notes"])


class FakeNl:
    def __init__(self, devices, ports, netns_mode=1):
        self._d, self._p, self._m = devices, ports, netns_mode

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def devices(self):
        return self._d

    def ports(self, index, name):
        return self._p.get(name, [])

    def system(self):
        return rdma_nl.SysRow(self._m)


def test_rdma_netlink_is_cross_checked_with_sysfs(node, tmp_path):
    devs, _ = rdma_view.rdma_discovery.discover(Roots.of(sys=str(node.sys)))
    nl = FakeNl([rdma_nl.DevRow(0, "mlx5_0", node_guid="0c42:a103:0001:0000"),
                 rdma_nl.DevRow(1, "mlx5_1", node_guid="ffff:0000:0000:0001"), rdma_nl.DevRow(9, "mlx5_9")],
                {"mlx5_0": [rdma_nl.PortRow(0, "mlx5_0", 1, state=1)]}, netns_mode=0)
    view = rdma_status.read_netlink(devs, reader_factory=lambda: nl)
    assert view.available and view.devices == ["mlx5_0", "mlx5_1", "mlx5_9"] and view.netns_exclusive is True
    assert "mlx5_9: seen over RDMA netlink, not in sysfs" in view.notes
    assert "mlx5_0:1: state DOWN over netlink, ACTIVE in sysfs" in view.notes
    assert any(n.startswith("mlx5_1: node GUID ffff:0000:0000:0001 over netlink") for n in view.notes)
    assert "mlx5_2: in sysfs, not over RDMA netlink" in view.notes and any("exclusive" in n for n in view.notes)

    def refused():
        raise rdma_nl.RdmaNetlinkAbsent("open", "RDMA netlink socket", "node", "no RDMA netlink", 93)

    view = rdma_status.read_netlink(devs, reader_factory=refused)
    assert not view.available and view.notes == ["RDMA netlink: no RDMA netlink, yet sysfs shows devices"]
    assert rdma_status.read_netlink((), reader_factory=refused).notes == []


def test_the_cli_command_prints_json(node, tmp_path, capsys):
    # The parser, not cli.main: main configures logging onto capsys's stream, which outlives this test.
    args = cli.build_parser().parse_args(["rdma", "status", "--json", "--no-netlink", "--no-sm-check", "--interval", "0",
                                          "--sysfs-root", str(node.sys), "--config", str(tmp_path / "t.yaml")])
    rc = args.fn(args)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and "netlink" not in out and ports(out)["mlx5_1:1"]["tenant"] == "tenant-a"


def test_status_and_top_show_rdma_ports_beside_the_tc_classes(node, tmp_path):
    w = rdma_view.RdmaWatch.open(Roots.of(sys=str(node.sys)), str(tmp_path / "t.yaml"))
    w.sample(0.0)
    node.set_counter("mlx5_1", 1, "port_xmit_data", 250)
    shutil.rmtree(node.sys / "class" / "infiniband" / "mlx5_3" / "ports")
    w.sample(1.0)
    rows = {(r["device"], r["port"]): r for r in rdma_view.tenant_rows(w.view())}
    assert rows[("mlx5_1", 1)]["path"] == "rdma" and rows[("mlx5_1", 1)]["rate_bps"] == 1000 * 8
    assert rows[("mlx5_3", 1)]["readable"] is False and "bytes" not in rows[("mlx5_3", 1)]
    text = top.render([], {}, 2.0, rdma=w.view())
    line = next(l for l in text.splitlines() if " mlx5_1 " in f" {l} ")
    assert "RDMA ports" in text and line.split()[:5] == ["tenant-a", "mlx5_1", "1", "InfiniBand", "8Kbps"]
    assert next(l for l in text.splitlines() if "mlx5_3" in l).split()[4:] == ["-", "-", "-", "-", "-"]
