"""RDMA discovery on a fixture sysfs tree modelled on an mlx5 node (no RDMA hardware needed)."""

from __future__ import annotations

from shaperd.discovery import rdma
from shaperd.core.roots import Roots

from ..rdma_fixture import ROCE_V2_MAPPED, Node


def discovered(tmp_path):
    node = Node(tmp_path).build()
    return rdma.discover(Roots.of(sys=str(node.sys)))


def test_pf_vfs_and_ib_hca_are_found_with_their_pci_facts(tmp_path):
    devs, notes = discovered(tmp_path)
    by = {d.name: d for d in devs}
    assert sorted(by) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"] and notes == ()
    pf = by["mlx5_0"]
    assert (pf.pci, pf.is_vf, pf.pf_pci, pf.sriov_numvfs) == ("0000:3b:00.0", False, None, 2)
    vf = by["mlx5_2"]
    assert (vf.pci, vf.is_vf, vf.pf_pci, vf.sriov_numvfs) == ("0000:3b:00.2", True, "0000:3b:00.0", None)
    assert rdma.by_pci(devs, "0000:3B:00.3").name == "mlx5_3"


def test_roce_port_gids_types_netdevs_and_gid_index(tmp_path):
    devs, _ = discovered(tmp_path)
    port = next(d for d in devs if d.name == "mlx5_0").port(1)
    assert port.link_layer == "Ethernet" and port.state == "ACTIVE" and port.phys_state == "LinkUp"
    assert [g.index for g in port.gids] == [0, 1, 2, 3]  # empty entries are not GIDs
    assert port.gids[3].gid == ROCE_V2_MAPPED and port.gids[3].type == "RoCE v2"
    assert port.netdevs == ("ens1f0",)
    assert port.roce_v2_gid_index == 3  # the IPv4-mapped RoCE v2 GID
    assert port.lid is None


def test_infiniband_port_lids_and_rate(tmp_path):
    devs, _ = discovered(tmp_path)
    port = next(d for d in devs if d.name == "mlx5_1").port(1)
    assert (port.link_layer, port.lid, port.sm_lid, port.rate_gbps) == ("InfiniBand", 4, 1, 200.0)
    assert port.roce_v2_gid_index is None


def test_unreadable_and_missing_facts_are_noted_not_guessed(tmp_path):
    node = Node(tmp_path).build()
    (node.sys / "class" / "infiniband" / "mlx5_1" / "ports" / "1" / "link_layer").unlink()
    (node.sys / "module" / "ib_core" / "parameters" / "netns_mode").write_text("N\n")
    devs, notes = rdma.discover(Roots.of(sys=str(node.sys)))
    assert next(d for d in devs if d.name == "mlx5_1").ports == ()
    assert any("mlx5_1:1: link_layer unreadable" in n for n in notes)
    assert any("exclusive" in n for n in notes)


def test_no_infiniband_class_means_no_devices(tmp_path):
    assert rdma.discover(Roots.of(sys=str(tmp_path))) == ((), ())
