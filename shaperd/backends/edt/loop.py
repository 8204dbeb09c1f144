"""The edt rate controller's loop: every ``interval_s`` read each stamper's counters, step, write the rates.

Owns the schedule and the per-device controller state; the algorithm is
backends/edt/controller.py (pure), the map access kernel/edt_prog.py behind
the injected ``open_maps(device_plan)`` (so tests run it on fakes with an
injected clock). Read, diff, then write: only keys whose rate changed are
written. A device whose maps cannot be read is reported once per failure and
retried at the next step; it never stops the other devices. The daemon hands
it the edt plan after each reconcile (``set_targets``). Capped pods' keys are
measured here (for their metrics) but never written: their static rates are
the backend's (backends/edt/diff.py), and only the shares' keys are stepped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from shaperd.core import log
from shaperd.backends.edt import controller
from shaperd.backends.edt.plan import controller_shares
from shaperd.core.periodic import Periodic

DEFAULT_INTERVAL_S = 0.02


@dataclass(frozen=True)
class LoopSettings:
    period_s: float = DEFAULT_INTERVAL_S


class EdtLoop(Periodic):
    thread_name = "shaperd-edt-rates"

    def __init__(self, open_maps, clock=time.monotonic, settings: LoopSettings = LoopSettings(),
                 mono_ns=lambda: time.clock_gettime_ns(time.CLOCK_MONOTONIC)):
        self.open_maps = open_maps
        self.clock = clock
        self.mono_ns = mono_ns  # the stamper's clock (bpf_ktime_get_ns), for the backlog test
        self.settings = settings
        self.log = log.get("shaperd.edt")
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self._plans: dict[str, object] = {}
        self._maps: dict[str, object] = {}
        self._state: dict[str, controller.State] = {}
        self._written: dict[str, dict[int, int]] = {}
        self._pods_measured: dict[str, dict[int, int]] = {}  # device -> pod key -> bit/s over the window
        self.errors: dict[str, str] = {}
        self.writes = 0  # bpf() update calls so far (read-diff-write: zero while rates hold)

    def set_targets(self, plans) -> None:
        """The edt device plans to control now; devices gone or re-planned start afresh. Re-planned means what
        the controller works with changed (the device, its capacity, its shares, its stamper): a pod that
        comes, goes or changes its cap, or a changed classifier, keeps the controller's state."""
        with self._lock:
            new = {dp.device: dp for dp in plans}
            for dev in list(self._plans):
                if dev not in new or _controlled(new[dev]) != _controlled(self._plans[dev]):
                    self._forget(dev)
            self._plans = new

    def _forget(self, dev: str) -> None:
        m = self._maps.pop(dev, None)
        if m is not None:
            m.close()
        self._state.pop(dev, None)
        self._written.pop(dev, None)
        self._pods_measured.pop(dev, None)

    def rates(self, device: str) -> dict[int, int]:
        """The rates (bit/s per key) of the last step on ``device``."""
        with self._lock:
            st = self._state.get(device)
            return dict(st.rates_bps) if st else {}

    def snapshot(self) -> list[tuple[str, str | None, int, int, int]]:
        """(device, tenant or None for the default key, key, rate written bit/s, measured bit/s) of the last steps."""
        out = []
        with self._lock:
            for dev, dp in sorted(self._plans.items()):
                st = self._state.get(dev)
                if st is None:
                    continue
                for s in dp.shares:
                    out.append((dev, s.tenant, s.key, st.rates_bps.get(s.key, 0), st.measured_bps.get(s.key, 0)))
        return out

    def pod_snapshot(self) -> list[tuple[str, str, str | None, int, int, int | None]]:
        """(device, pod namespace/name, tenant or None, key, rate bit/s (its static rate), measured bit/s or None
        before a window has passed) of each capped pod's key on the devices stepped."""
        out = []
        with self._lock:
            for dev, dp in sorted(self._plans.items()):
                if dev not in self._state:
                    continue
                measured = self._pods_measured.get(dev, {})
                for p in getattr(dp, "pods", ()):
                    out.append((dev, p.ref, p.tenant, p.key, p.rate_bps, measured.get(p.key)))
        return out

    def sample_once(self) -> None:
        with self._lock:
            for dev, dp in sorted(self._plans.items()):
                try:
                    self._step(dev, dp)
                    self.errors.pop(dev, None)
                except Exception as e:  # noqa: BLE001 - one device never stops the others
                    if self.errors.get(dev) != str(e):
                        self.log.error("edt rate step failed", device=dev, error=str(e))
                    self.errors[dev] = str(e)
                    self._forget(dev)

    def _step(self, dev: str, dp) -> None:
        maps = self._maps.get(dev)
        if maps is None:
            maps = self._maps[dev] = self.open_maps(dp)
        totals = {k: s.bytes for k, s in maps.read_stats().items()}
        shares = controller_shares(dp)
        # Backlog: the tenant's departure clock is ahead of now (same CLOCK_MONOTONIC as bpf_ktime_get_ns).
        clocks = maps.read_clocks([s.key for s in shares])
        now_ns = self.mono_ns()
        backlogged = frozenset(k for k, c in clocks.items() if c > now_ns)
        before, now_s = self._state.get(dev, controller.State()), self.clock()
        st = controller.step(dp.capacity_bps, shares, before, now_s, totals, backlogged)
        self._state[dev] = st
        # The capped pods' keys are measured over the same window, never controlled: their rates are the
        # backend's (static), and only the shares' keys are ever written below.
        self._pods_measured[dev] = controller.measured_bps(before, now_s, totals, [p.key for p in dp.pods])
        q16 = {k: controller.ns_per_byte_q16(r) for k, r in st.rates_bps.items()}
        last = self._written.setdefault(dev, {})
        changed = {k: v for k, v in q16.items() if last.get(k) != v}
        if changed:
            self.writes += maps.write_rates(changed)
            last.update(changed)

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        with self._lock:
            for dev in list(self._maps):
                self._forget(dev)


def _controlled(dp) -> tuple:
    """What the controller works with on one device plan (its state restarts when this changes)."""
    return dp.device, dp.ifindex, dp.capacity_bps, dp.shares, dp.stamper


def maps_opener(netns: str | None, pins=None):
    """open_maps for the loop: the stamper's maps found from its filter, read on a socket of the loop's own;
    through the bpffs ``pins`` (the "edt-stamper" PinStore) when given, else by id."""
    from shaperd.backends.edt import kernel_stamper
    from shaperd.kernel.rtnl import RtnlReader

    def open_maps(dp):
        with RtnlReader(netns) as reader:
            return kernel_stamper.open_for_device(reader, dp.ifindex, dp.device, dp.stamper.name, pins)

    return open_maps


class Job:
    """The daemon's handle on the loop (the edt spec's ``job``): started when an uplink first is on edt."""

    def __init__(self, netns: str | None, pins=None, loop_factory=None):
        self.netns, self.pins = netns, pins
        self._factory = loop_factory or (lambda: EdtLoop(maps_opener(netns, pins)))
        self.loop: EdtLoop | None = None

    def update(self, desired) -> None:
        """After each reconcile: the edt plan's devices become the loop's targets."""
        devices = getattr(desired, "devices", ())
        if self.loop is None and devices:
            self.loop = self._factory()
            self.loop.start()
        if self.loop is not None:
            self.loop.set_targets(devices)

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
