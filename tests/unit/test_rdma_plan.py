"""The RDMA plan: devices resolved per tenant, service levels and traffic classes derived or given."""

from __future__ import annotations

from shaperd.core import config
from shaperd.rdma import plan as rp
from shaperd.discovery import rdma
from shaperd.core.inventory import Inventory
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..rdma_fixture import Node

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 40Gbps
    priority: 100
    rdma: {devices: ["mlx5_1:1"], nccl: {NCCL_IB_TIMEOUT: "22"}}
  - name: tenant-b
    bandwidthGuarantee: 20Gbps
    priority: 50
    rdma: {devices: ["0000:3b:00.2", "mlx5_9"], serviceLevel: 3, trafficClass: 106}
  - name: tenant-c
    bandwidthGuarantee: 1Gbps
    priority: 10
"""


def planned(tmp_path, text=CFG, data_vls=rp.DEFAULT_DATA_VLS):
    devs, notes = rdma.discover(Roots.of(sys=str(Node(tmp_path).build().sys)))
    cfg = config.load_text(text)
    inv = Inventory(rdma=devs, rdma_notes=notes)
    return rp.plan(cfg, inv, tenancy(cfg, inv), data_vls)


def test_devices_by_name_port_and_pci_and_a_missing_one_warns(tmp_path):
    p = planned(tmp_path)
    a, b, c = (p.tenant(n) for n in ("tenant-a", "tenant-b", "tenant-c"))
    assert [x.ref for x in a.ports] == ["mlx5_1:1"] and not a.roce
    assert [x.ref for x in b.ports] == ["mlx5_2:1"] and b.roce  # the VF at 0000:3b:00.2
    assert c.ports == ()
    assert p.owners == {("mlx5_1", 1): "tenant-a", ("mlx5_2", 1): "tenant-b"}
    assert p.warnings == ("tenants[1].rdma.devices[1]: mlx5_9 does not exist on this node",)


def test_service_level_and_traffic_class_explicit_or_by_rank(tmp_path):
    p = planned(tmp_path)
    a, b, c = (p.tenant(n) for n in ("tenant-a", "tenant-b", "tenant-c"))
    assert (a.service_level, a.sl_derived, a.traffic_class, a.dscp) == (0, True, 106, 26)
    assert (b.service_level, b.sl_derived, b.traffic_class, b.tc_derived) == (3, False, 106, False)
    assert (c.service_level, c.traffic_class) == (2, (18 << 2) | 2)
    assert a.nccl == {"NCCL_IB_TIMEOUT": "22"}


def test_more_ranks_than_data_vls_are_grouped_never_vl15(tmp_path):
    text = "tenants:\n" + "".join(f"  - {{name: t{i}, bandwidthGuarantee: 1Mbps, priority: {100 - i}}}\n"
                                  for i in range(6))
    p = planned(tmp_path, text, data_vls=4)
    assert [t.service_level for t in p.tenants] == [0, 1, 2, 3, 3, 3]
