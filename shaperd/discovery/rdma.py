"""Discover the node's RDMA devices from sysfs: ports, link layers, GIDs, PCI and SR-IOV facts.

Reads <sys>/class/infiniband (Roots, so tests use fixture trees modelled on
a real mlx5 node). Every file is optional: a missing or unreadable one
leaves that fact unknown and is noted, never guessed. A device moved into a
pod's network namespace (ib_core netns_mode exclusive) is invisible from the
host: that is said in the notes, and what is visible is read.

Read-only; no netlink here (kernel/rdma_nl.py reads the same facts over
RDMA netlink where the kernel answers).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from shaperd.core.inventory import Gid, RdmaDevice, RdmaPort
from shaperd.core.roots import DEFAULT, Roots

_EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# A PCI function address as sysfs names it, domain included: "0000:3b:00.2".
PCI_ADDRESS_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _state(text: str | None) -> str:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if not text:
        return ""
    return text.split(":", 1)[1].strip() if ":" in text else text


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _pci_of(dev_dir: Path) -> tuple[str | None, bool, str | None, int | None]:
    """(PCI address, is a VF, its PF's address, sriov_numvfs) from <dev>/device."""
    device = dev_dir / "device"
    try:
        target = Path(os.path.realpath(device))
    except OSError:
        return None, False, None, None
    if not device.exists() or "pci" not in str(target):
        return None, False, None, None  # a software device (rxe) has no PCI function
    physfn = device / "physfn"
    pf = Path(os.path.realpath(physfn)).name if physfn.exists() else None
    return target.name, pf is not None, pf, _int(_read(device / "sriov_numvfs"))


def sriov_place(dev_dir: Path) -> tuple[int | None, str | None, str | None]:
    """A VF's (number on its PF, the PF's netdev, the PF's driver); None for each fact that cannot be read.

    The number is N of the PF's ``virtfnN`` symlink that points at this function; the netdev the
    (first) entry of the PF's ``net/``; the driver the name the PF's ``driver`` symlink points at.
    """
    pf_dir = dev_dir / "device" / "physfn"
    try:
        pf_dir = Path(os.path.realpath(pf_dir))
        me = Path(os.path.realpath(dev_dir / "device")).name
        index = next((int(p.name[6:]) for p in pf_dir.iterdir() if p.name.startswith("virtfn")
                      and p.name[6:].isdigit() and Path(os.path.realpath(p)).name == me), None)
    except OSError:
        return None, None, None
    try:
        netdev = min(p.name for p in (pf_dir / "net").iterdir())
    except (OSError, ValueError):
        netdev = None
    drv = pf_dir / "driver"
    driver = Path(os.path.realpath(drv)).name if drv.exists() else None
    return index, netdev, driver


def pf_devlink(dev_dir: Path) -> str | None:
    """A VF's PF's devlink handle as devlink names it: ``<bus>/<device>``, the bus from the PF's ``subsystem``
    link (``pci/0000:3b:00.0`` on a PCI NIC; netdevsim's ``netdevsim/netdevsim10``); None if unreadable."""
    try:
        pf_dir = Path(os.path.realpath(dev_dir / "device" / "physfn"))
        sub = pf_dir / "subsystem"
        return f"{Path(os.path.realpath(sub)).name}/{pf_dir.name}" if sub.exists() else None
    except OSError:
        return None


def _gids(port_dir: Path, notes: list[str], ref: str) -> tuple[Gid, ...]:
    out = []
    gids_dir = port_dir / "gids"
    try:
        entries = sorted((int(p.name), p) for p in gids_dir.iterdir() if p.name.isdigit())
    except OSError:
        return ()
    for idx, path in entries:
        gid = _read(path)
        if not gid or gid == _EMPTY_GID:
            continue
        # Reading the type of an empty entry fails with EINVAL on real kernels; a populated one answers.
        typ = _read(port_dir / "gid_attrs" / "types" / str(idx)) or ""
        ndev = _read(port_dir / "gid_attrs" / "ndevs" / str(idx))
        out.append(Gid(idx, gid, typ, ndev or None))
    return tuple(out)


def read_port(dev: str, port_dir: Path, notes: list[str]) -> RdmaPort | None:
    try:
        n = int(port_dir.name)
    except ValueError:
        return None
    ref = f"{dev}:{n}"
    link_layer = _read(port_dir / "link_layer")
    if link_layer is None:
        notes.append(f"{ref}: link_layer unreadable; port skipped")
        return None
    rate = _read(port_dir / "rate") or ""
    m = _RATE_RE.match(rate)
    gids = _gids(port_dir, notes, ref)
    ib = link_layer == "InfiniBand"
    return RdmaPort(
        device=dev, port=n, link_layer=link_layer, state=_state(_read(port_dir / "state")),
        phys_state=_state(_read(port_dir / "phys_state")), rate=rate, rate_gbps=float(m.group(1)) if m else None,
        lid=_int(_read(port_dir / "lid")) if ib else None, sm_lid=_int(_read(port_dir / "sm_lid")) if ib else None,
        gids=gids, netdevs=tuple(dict.fromkeys(g.netdev for g in gids if g.netdev)),
    )


def read_device(dev_dir: Path, notes: list[str]) -> RdmaDevice:
    name = dev_dir.name
    pci, is_vf, pf, numvfs = _pci_of(dev_dir)
    vf_index, pf_netdev, pf_driver = sriov_place(dev_dir) if is_vf else (None, None, None)
    ports = []
    try:
        port_dirs = sorted((dev_dir / "ports").iterdir(), key=lambda p: p.name)
    except OSError:
        notes.append(f"{name}: no ports directory readable")
        port_dirs = []
    for pd in port_dirs:
        p = read_port(name, pd, notes)
        if p is not None:
            ports.append(p)
    return RdmaDevice(
        name=name, node_type=_read(dev_dir / "node_type") or "", node_guid=_read(dev_dir / "node_guid") or "",
        fw_ver=_read(dev_dir / "fw_ver") or "", pci=pci, is_vf=is_vf, pf_pci=pf, sriov_numvfs=numvfs,
        parent=_read(dev_dir / "parent"), ports=tuple(ports), vf_index=vf_index, pf_netdev=pf_netdev,
        pf_driver=pf_driver, pf_devlink=pf_devlink(dev_dir) if is_vf else None,
    )


def netns_exclusive(roots: Roots = DEFAULT) -> bool | None:
    """ib_core's netns mode: True when exclusive (devices live in one namespace each), None if unknown."""
    v = _read(roots.sys / "module" / "ib_core" / "parameters" / "netns_mode")
    if v is None:
        return None
    return v in ("N", "0")


def discover(roots: Roots = DEFAULT) -> tuple[tuple[RdmaDevice, ...], tuple[str, ...]]:
    """(devices visible here, notes on what could not be read or seen)."""
    notes: list[str] = []
    base = roots.infiniband
    if netns_exclusive(roots):
        notes.append("RDMA netns mode is exclusive: devices moved into pod network namespaces are not visible "
                     "from the host and are not reported")
    try:
        dirs = sorted(base.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        return (), tuple(notes)
    except OSError as e:
        return (), tuple(notes + [f"{base}: {e.strerror or e}"])
    return tuple(read_device(d, notes) for d in dirs), tuple(notes)


def by_pci(devices: tuple[RdmaDevice, ...], pci: str) -> RdmaDevice | None:
    """The RDMA device of a PCI function (an SR-IOV device plugin's id is the VF's address)."""
    pci = pci.lower()
    return next((d for d in devices if d.pci == pci), None)


def devices_of_pci(pci: str, roots: Roots = DEFAULT) -> tuple[str, ...]:
    """The RDMA devices of a PCI function, from <sys>/bus/pci/devices/<pci>/infiniband/; () if none.

    An SR-IOV device plugin names the VFs it assigns by PCI address; a VF
    bound to mlx5_core has one RDMA device there (a plain netdevice or a
    vfio-pci VF has none).
    """
    if not PCI_ADDRESS_RE.match(pci):
        return ()
    ib = roots.sys / "bus" / "pci" / "devices" / pci.lower() / "infiniband"
    try:
        return tuple(sorted(p.name for p in ib.iterdir()))
    except OSError:
        return ()
