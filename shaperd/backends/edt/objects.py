"""The edt backend's objects, as plain data: root mq, sch_fq per TX queue, clsact, the stamper filter.

Desired (planner) and observed (kernel reader) state use the same types, so
the diff compares like with like. Also the stamper's map layout constants
shared by the kernel side (kernel_stamper.py) and the controller, and a capped
pod's key (EdtPodKey). Pure.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from shaperd.backends.common.objects import DEFAULT_CLASS_MINOR

# Root handle major "se": fixed, so ownership shows in a dump alone (HTB's is "sh", 7368).
EDT_MAJOR = 0x7365
ROOT_HANDLE = EDT_MAJOR << 16
# sch_fq under mq class 7365:<q> gets handle <FQ_MAJOR_BASE + q>: unique majors per device.
FQ_MAJOR_BASE = 0x8000
# The stamper on clsact egress runs after the map classifier (which wt-cls attaches at a lower prio).
PRIO_STAMPER = 0xC000
STAMPER_HANDLE = 1
# Map keys are class minors; traffic of no tenant is counted and paced under the default class's minor.
DEFAULT_KEY = DEFAULT_CLASS_MINOR
KEY_SPACE = 1 << 16
STATS_MAX_ENTRIES = 4096


STAMPER_PREFIX = "shpe_"
STAMPER_VERSION = b"shaperd-edt-stamper-v2"


def stamper_name(horizon_ns: int) -> str:
    """'shpe_' + 10 hex of the program's version and parameters: BPF_OBJ_NAME_LEN, and the filter's TCA_BPF_NAME.

    A new program version or horizon gives a new name, so the diff re-attaches (v2: the parents map and the
    second clock step of capped pods; a v1 stamper is replaced, never adopted)."""
    h = hashlib.sha256(STAMPER_VERSION + b"\0" + struct.pack("<Q", horizon_ns)).hexdigest()[:10]
    return STAMPER_PREFIX + h


class Stats(NamedTuple):
    """One key's per-CPU counters summed: what the stamper passed and dropped."""

    bytes: int
    packets: int
    dropped: int


@dataclass(frozen=True)
class FqQdisc:
    """sch_fq on one TX queue (parent 7365:<q>) or at the root of a single-queue device (parent root)."""

    parent: int
    handle: int
    limit_packets: int
    flow_limit_packets: int
    horizon_us: int
    horizon_drop: bool = True


@dataclass(frozen=True)
class Stamper:
    """The stamper filter: identified by its program name (which encodes its parameters)."""

    name: str
    horizon_ns: int
    prio: int = PRIO_STAMPER


@dataclass(frozen=True)
class EdtShareSpec:
    """What the controller needs about one key on one device (labels for status too)."""

    key: int
    tenant: str | None
    guarantee_bps: int
    limit_bps: int
    priority: int


@dataclass(frozen=True)
class EdtPodKey:
    """A capped pod's stamper key on one device: its own class minor, its parent (its tenant's key, or the
    default key for a pod of no tenant) and its static rate (min(cap, the tenant's limit, capacity)), which
    the backend writes and the rate controller never touches."""

    key: int
    parent: int
    rate_bps: int
    ns_per_byte_q16: int
    uid: str = field(compare=False, default="")
    ref: str = field(compare=False, default="")  # namespace/name
    tenant: str | None = field(compare=False, default=None)
    cap_bps: int = field(compare=False, default=0)  # the annotation's value


@dataclass(frozen=True)
class EdtDevicePlan:
    device: str
    ifindex: int
    capacity_bps: int
    tx_queues: int
    root_kind: str  # "mq" (several TX queues) or "fq" (one)
    fqs: tuple[FqQdisc, ...]
    stamper: Stamper
    shares: tuple[EdtShareSpec, ...] = ()
    tenant_keys: dict[str, int] = field(default_factory=dict, compare=False)
    # The eBPF map classifier (backends/htb/mapcls.py) that writes the tenant's class id into skb->priority,
    # planned exactly as on an htb uplink; None where the kernel has no eBPF maps (then only SO_PRIORITY works).
    map_classifier: object | None = None
    # Capped pods' keys (a pod's own class minor, backends/common/classify.pod_minors), by key.
    pods: tuple[EdtPodKey, ...] = ()


@dataclass
class EdtDeviceState:
    """What the kernel holds on one device, as far as the edt backend cares."""

    device: str
    ifindex: int
    root_kind: str | None = None
    root_handle: int = 0
    fqs: dict[int, FqQdisc] = field(default_factory=dict)  # by parent
    clsact: bool = False
    stamper_name: str | None = None
    stamper_prog_id: int = 0
    map_classifier: object | None = None  # kernel/bpf_classify.py ObservedMapClassifier
    # The attached stamper's pod keys: key -> (parent, rate in ns per byte Q16) of every key with a parent;
    # None where its maps were not read (no stamper, or ``maps_error``).
    pod_entries: dict[int, tuple[int, int]] | None = None
    maps_error: str | None = None

    @property
    def owned(self) -> bool:
        return self.root_handle == ROOT_HANDLE and self.root_kind in ("mq", "fq")
