"""Read RDMA port counters from sysfs: transmitted data, packets and wait, and the driver's hw counters.

Reads ``<sys>/class/infiniband/<dev>/ports/<n>/counters/`` (the IB PMA
counters) and ``.../hw_counters/`` (driver counters: np_cnp_sent,
rp_cnp_handled, out_of_sequence, ... whatever files the driver has). Roots
are injectable, so every read runs on fixture trees in tests. These are
sysfs attribute reads like the link speeds discovery reads (no device file,
no netlink), hence discovery/, not kernel/. Only reads: the figures are
turned into deltas and rates by report/rdma_accounting.py (pure).

What the numbers are (drivers/infiniband/core/sysfs.c): at port creation the
kernel asks the port's PMA for ClassPortInfo; with the extended-width
capability it serves ``counters/`` from PortCountersExtended, so
``port_xmit_data`` and ``port_xmit_packets`` are 64-bit and
``unicast_xmit_packets`` exists (the IETF set; "NoIETF" ports are 64-bit
without it). Otherwise they come from PortCounters, 32 bits wide, and the
IB spec makes those saturate at 2^32-1 rather than wrap. ``port_xmit_wait``
is always a 32-bit PortCounters field. ``port_xmit_data`` counts 4-byte
words (bytes = value x 4). A port whose PMA does not answer reads
"N/A (no PMA)"; soft-RoCE (rxe) has no ``counters/`` directory at all.

Every file is optional: what cannot be read is None (and noted), never 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from shaperd.core.roots import DEFAULT, Roots

XMIT_DATA, XMIT_PACKETS, XMIT_WAIT = "port_xmit_data", "port_xmit_packets", "port_xmit_wait"
# Present only when counters/ comes from PortCountersExtended with the IETF counters.
EXTENDED_MARKER = "unicast_xmit_packets"
LEGACY_MAX = 2**32 - 1
WORD_BYTES = 4  # PortXmitData counts 32-bit words
# Files in hw_counters/ that are settings, not counters.
NOT_COUNTERS = frozenset({"lifespan"})


@dataclass(frozen=True)
class PortCounters:
    """One read of one port's counters; None where a value could not be read (see ``notes``)."""

    device: str
    port: int
    xmit_data_words: int | None = None
    xmit_packets: int | None = None
    xmit_wait: int | None = None
    # True: 64-bit extended counters (PortCountersExtended). None: the files do not say (32-bit legacy
    # counters, or a NoIETF 64-bit port whose values have not passed 2^32 yet).
    extended: bool | None = None
    has_counters_dir: bool = True
    hw: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def xmit_bytes(self) -> int | None:
        return None if self.xmit_data_words is None else self.xmit_data_words * WORD_BYTES

    def width_bits(self, counter: str) -> int | None:
        """How wide a counter is: 64, 32, or None when it cannot be told (treated as possibly 32)."""
        if counter == XMIT_WAIT:
            return 32
        if counter in (XMIT_DATA, XMIT_PACKETS):
            return 64 if self.extended else None
        return 64  # hw counters are u64 (rdma_hw_stats.value)

    def saturated(self, counter: str, value: int | None) -> bool:
        """A counter that may be 32 bits wide and reads 2^32-1 has stopped counting (IB PortCounters saturate)."""
        return value == LEGACY_MAX and self.width_bits(counter) != 64


def _value(path: Path, ref: str, notes: list[str]) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        notes.append(f"{ref}: {path.parent.name}/{path.name} unreadable: {e.strerror or e}")
        return None
    except UnicodeDecodeError:
        text = "<binary>"
    try:
        return int(text, 10)
    except ValueError:
        notes.append(f"{ref}: {path.parent.name}/{path.name} reads {text[:40]!r}, not a counter")
        return None


def read_port(roots: Roots, device: str, port: int) -> PortCounters | None:
    """One port's counters; None when the port itself is gone or unreadable (no series, never zeros)."""
    base = roots.infiniband / device / "ports" / str(port)
    if not base.is_dir():
        return None
    ref = f"{device}:{port}"
    notes: list[str] = []
    counters = base / "counters"
    has_dir = counters.is_dir()
    data = packets = wait = None
    extended: bool | None = None
    if has_dir:
        data = _value(counters / XMIT_DATA, ref, notes)
        packets = _value(counters / XMIT_PACKETS, ref, notes)
        wait = _value(counters / XMIT_WAIT, ref, notes)
        if (counters / EXTENDED_MARKER).exists() or any(v is not None and v > LEGACY_MAX for v in (data, packets)):
            extended = True
    else:
        notes.append(f"{ref}: no counters/ directory (the driver has no PMA counters, as with rxe): "
                     "bytes and packets on this port are not counted")
    hw: dict[str, int] = {}
    hw_dir = base / "hw_counters"
    try:
        names = sorted(p.name for p in hw_dir.iterdir() if p.name not in NOT_COUNTERS)
    except FileNotFoundError:
        names = []
    except OSError as e:
        notes.append(f"{ref}: hw_counters/ unreadable: {e.strerror or e}")
        names = []
    for name in names:
        v = _value(hw_dir / name, ref, notes)
        if v is not None:
            hw[name] = v
    return PortCounters(device, port, data, packets, wait, extended, has_dir, hw, tuple(notes))


def read_ports(roots: Roots, ports: Iterable[tuple[str, int]]) -> dict[tuple[str, int], PortCounters | None]:
    """Counters of each (device, port); None for a port that cannot be read."""
    return {(d, p): read_port(roots, d, p) for d, p in ports}


def list_ports(roots: Roots = DEFAULT) -> list[tuple[str, int]]:
    """(device, port) of every port under <sys>/class/infiniband, without reading anything else."""
    out = []
    try:
        devices = sorted(roots.infiniband.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    for dev in devices:
        try:
            out.extend((dev.name, n) for n in sorted(int(p.name) for p in (dev / "ports").iterdir()
                                                     if p.name.isdigit()))
        except OSError:
            continue
    return out
