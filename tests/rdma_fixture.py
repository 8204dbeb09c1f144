"""Fixture sysfs trees modelled on a real mlx5 node, for RDMA discovery and counter tests.

``Node(tmp_path).build()`` lays out, under <tmp>/sys:
- mlx5_0: a ConnectX PF at 0000:3b:00.0, RoCE (link layer Ethernet) on netdev ens1f0,
  SR-IOV with sriov_numvfs 2 (net/ens1f0, driver -> mlx5_core), GIDs 0 (RoCE v1, fe80::) and 1/3 (RoCE v2: fe80:: and IPv4-mapped);
- mlx5_2, mlx5_3: its VFs at 0000:3b:00.2 and 0000:3b:00.3 (device/physfn -> the PF), netdevs ens1f0v0/v1;
- mlx5_1: an InfiniBand HCA at 0000:5e:00.0, port 1 ACTIVE, LID 4, SM LID 1, 200 Gb/sec (4X HDR).
with the same symlink structure the kernel has (class/infiniband/X -> devices/.../infiniband/X,
bus/pci/devices/ADDR -> devices/.../ADDR, device -> the PCI function). Counters live under
ports/N/counters (64-bit extended ones unless a port's spec says ``extended: False``) and
ports/N/hw_counters (with the ``lifespan`` setting real drivers have); ``set_counter`` advances them.
"""

from __future__ import annotations

import os
from pathlib import Path

ROCE_V2_MAPPED = "0000:0000:0000:0000:0000:ffff:c612:0001"  # ::ffff:198.18.0.1
EMPTY = "0000:0000:0000:0000:0000:0000:0000:0000"


class Node:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.sys = self.root / "sys"

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def pci_function(self, addr: str, bus: str = "pci0000:3a") -> Path:
        d = self.sys / "devices" / bus / addr
        d.mkdir(parents=True, exist_ok=True)
        self._link(self.sys / "bus" / "pci" / "devices" / addr, d)
        return d

    def device(self, name: str, pci: Path | None, ports: dict[int, dict], guid: str = "0c42:a103:0001:0000") -> Path:
        base = (pci / "infiniband" / name) if pci else (self.sys / "devices" / "virtual" / "infiniband" / name)
        self._write(base / "node_type", "1: CA")
        self._write(base / "node_guid", guid)
        self._write(base / "fw_ver", "22.36.1010")
        if pci is not None:
            self._link(base / "device", pci)
        for n, spec in ports.items():
            p = base / "ports" / str(n)
            self._write(p / "link_layer", spec["link_layer"])
            self._write(p / "state", spec.get("state", "4: ACTIVE"))
            self._write(p / "phys_state", spec.get("phys_state", "5: LinkUp"))
            self._write(p / "rate", spec.get("rate", "100 Gb/sec (2X HDR)"))
            if spec["link_layer"] == "InfiniBand":
                self._write(p / "lid", spec.get("lid", "0x4"))
                self._write(p / "sm_lid", spec.get("sm_lid", "0x1"))
            gids = spec.get("gids", [])
            for i in range(max(4, len(gids))):
                gid, typ, ndev = gids[i] if i < len(gids) else (EMPTY, None, None)
                self._write(p / "gids" / str(i), gid)
                if typ is not None:
                    self._write(p / "gid_attrs" / "types" / str(i), typ)
                    if ndev is not None:  # an InfiniBand GID has no netdev
                        self._write(p / "gid_attrs" / "ndevs" / str(i), ndev)
            counters = ("port_xmit_data", "port_xmit_packets", "port_rcv_data", "port_xmit_wait")
            if spec.get("extended", True):  # PortCountersExtended (ConnectX): 64-bit, with the IETF set
                counters += ("unicast_xmit_packets", "multicast_xmit_packets")
            for c in counters:
                self._write(p / "counters" / c, "0")
            for c in ("np_cnp_sent", "rp_cnp_handled", "out_of_sequence"):
                self._write(p / "hw_counters" / c, "0")
            self._write(p / "hw_counters" / "lifespan", "10")  # a setting (ms), not a counter
        self._link(self.sys / "class" / "infiniband" / name, base)
        return base

    def set_counter(self, dev: str, port: int, name: str, value: int, hw: bool = False) -> None:
        d = self.sys / "class" / "infiniband" / dev / "ports" / str(port) / ("hw_counters" if hw else "counters")
        (d / name).write_text(f"{value}\n")

    def build(self) -> "Node":
        pf = self.pci_function("0000:3b:00.0")
        self._write(pf / "sriov_numvfs", "2")
        (pf / "net" / "ens1f0").mkdir(parents=True, exist_ok=True)  # the PF's netdev (VF rates are set on it)
        (self.sys / "bus" / "pci" / "drivers" / "mlx5_core").mkdir(parents=True, exist_ok=True)
        self._link(pf / "driver", self.sys / "bus" / "pci" / "drivers" / "mlx5_core")
        self.device("mlx5_0", pf, {1: {"link_layer": "Ethernet", "gids": [
            ("fe80:0000:0000:0000:0e42:a1ff:fe03:0001", "IB/RoCE v1", "ens1f0"),
            ("fe80:0000:0000:0000:0e42:a1ff:fe03:0001", "RoCE v2", "ens1f0"),
            ("0000:0000:0000:0000:0000:ffff:c612:0001", "IB/RoCE v1", "ens1f0"),
            (ROCE_V2_MAPPED, "RoCE v2", "ens1f0"),
        ]}})
        for i, fn in enumerate(("0000:3b:00.2", "0000:3b:00.3")):
            vf = self.pci_function(fn)
            self._link(vf / "physfn", pf)
            self._link(pf / f"virtfn{i}", vf)
            self.device(f"mlx5_{2 + i}", vf, {1: {"link_layer": "Ethernet", "gids": [
                (f"fe80:0000:0000:0000:0e42:a1ff:fe03:01{i:02x}", "RoCE v2", f"ens1f0v{i}")]}},
                guid=f"0c42:a103:0001:01{i:02x}")
        ib = self.pci_function("0000:5e:00.0", bus="pci0000:5d")
        self.device("mlx5_1", ib, {1: {"link_layer": "InfiniBand", "rate": "200 Gb/sec (4X HDR)",
                                       "gids": [("fe80:0000:0000:0000:0c42:a103:0002:0001", "IB/RoCE v1", None)]}},
                    guid="0c42:a103:0002:0000")
        self._write(self.sys / "module" / "ib_core" / "parameters" / "netns_mode", "Y")
        return self
