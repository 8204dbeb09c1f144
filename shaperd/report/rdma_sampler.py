"""A thread that reads RDMA port counters every period and publishes an immutable snapshot.

The RDMA path's counterpart of report/sampler.py's Sampler (which reads HTB
classes). ``read(ports)`` returns a read per (device, port) (sysfs, through
discovery/rdma_counters.read_ports); the accounting is
report/rdma_accounting.py. ``set_targets`` is called by the daemon after each
reconcile with the node's RDMA ports and their owners (the RDMA plan's
``owners``), so the thread never discovers or plans anything itself.

Must not: raise out of the thread (a failed read becomes the snapshot's
error), or touch anything but the read function.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from shaperd.core import log
from shaperd.core.inventory import RdmaDevice
from shaperd.report.rdma_accounting import Counters, PortTarget, RdmaAccumulator, RdmaPortSeries
from shaperd.core.periodic import Periodic


@dataclass(frozen=True)
class RdmaSnapshot:
    series: tuple[RdmaPortSeries, ...] = ()
    taken_at: float | None = None  # wall clock of the last successful sample
    ok: bool = False
    error: str | None = None
    duration_s: float = 0.0
    samples: int = 0
    failures: int = 0


@dataclass(frozen=True)
class RdmaSamplerSettings:
    # Every counters/ read is a PMA query the HCA's firmware answers, so sample less often than
    # the tc path's 0.5 s; one second still shows a change within a scrape interval.
    period_s: float = 1.0
    rate_window_s: float = 2.0


def targets_of(devices: Iterable[RdmaDevice], owners: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], PortTarget]:
    """Every port of the inventory's RDMA devices, with its owner where the plan names one."""
    return {(p.device, p.port): PortTarget(p.device, p.port, owners.get((p.device, p.port)) or None, p.link_layer)
            for d in devices for p in d.ports}


class RdmaSampler(Periodic):
    thread_name = "shaperd-rdma-sampler"

    def __init__(self, read: Callable[[list[tuple[str, int]]], Mapping[tuple[str, int], Counters | None]],
                 settings: RdmaSamplerSettings = RdmaSamplerSettings(), clock=time.monotonic, wall=time.time):
        self.read = read
        self.settings = settings
        self.acc = RdmaAccumulator(settings.rate_window_s)
        self.targets: Mapping[tuple[str, int], PortTarget] = {}
        self.snapshot = RdmaSnapshot()
        self.clock, self.wall = clock, wall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.log = log.get("shaperd.rdma_sampler")

    def set_targets(self, targets: Mapping[tuple[str, int], PortTarget]) -> None:
        self.targets = dict(targets)  # one reference swap

    def sample_once(self) -> RdmaSnapshot:
        start = self.clock()
        prev = self.snapshot
        targets = self.targets
        try:
            reads = self.read(sorted(targets))
        except Exception as e:  # noqa: BLE001 - any failure becomes status, never a dead thread
            if not self._failing:
                self.log.error("RDMA counter sample failed", error=str(e))
            self._failing = True
            self.snapshot = RdmaSnapshot(prev.series, prev.taken_at, False, str(e), self.clock() - start,
                                         prev.samples, prev.failures + 1)
            return self.snapshot
        self._failing = False
        t = self.clock()
        self.acc.ingest(t, reads, targets)
        self.snapshot = RdmaSnapshot(self.acc.view(), self.wall(), True, None, t - start, prev.samples + 1,
                                     prev.failures)
        return self.snapshot

