"""The node-side check of the subnet manager's tables, where it shows: ``rdma status`` and the daemon's metrics.

The comparison is ``backends/rdma/smcheck.py`` (pure); the reads are
``kernel/ib_smp.py`` (smpquery, each call with its deadline), passed in as
``read(device, port)``, so tests use a fake reader. This module owns:

* ``port_dict``: a ``PortCheck`` as the ``sm_check`` field of ``rdma status``
  (``ok``, ``status`` verified / mismatch / not verified, the reason, and
  each mismatch with its table, SL or entry, expected and read);
* ``for_watch``: the per-port callback ``rdma_status.collect`` takes;
* ``SmChecker``: the daemon's periodic check on a thread of its own (every
  ``interval_s``, default 60 s; never on the reconcile loop, never on the
  counter sampler's 1 s thread, since a port can take two smpquery deadlines),
  publishing an immutable snapshot; ``families`` turns it into series.

Must not: write any table (shaperd never does from a node), raise out of
the thread, or export a value for a port that could not be read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from shaperd.core import log
from shaperd.rdma import smcheck
from shaperd.rdma.opensm import DEFAULT_MAX_VLS
from shaperd.core.config import Config
from shaperd.core.inventory import Inventory, RdmaPort
from shaperd.core.periodic import Periodic

Read = Callable[[str, int], smcheck.ObservedPort]
MaxVls = int | Mapping[str, int]


def port_dict(c: smcheck.PortCheck) -> dict:
    status = "not verified" if not c.verified else ("verified" if c.ok else "mismatch")
    mismatches = []
    for m in c.mismatches:
        row = {"table": m.table, "expected": m.expected, "observed": m.observed, "text": str(m)}
        row["sl" if m.table == "sl2vl" else "entry"] = m.index
        if m.table != "sl2vl":
            row["expected"], row["observed"] = ({"vl": v, "weight": w} for v, w in (m.expected, m.observed))
        mismatches.append(row)
    return {"ok": c.ok, "status": status, "reason": c.reason, "mismatches": mismatches, "summary": c.describe()}


def for_watch(read: Read, max_vls: MaxVls = DEFAULT_MAX_VLS, no_config: str | None = None):
    """``watch -> (port -> dict | None)`` for ``rdma_status.collect``: every InfiniBand port checked once."""

    def bind(w) -> Callable[[RdmaPort], Mapping | None]:
        ports = [p for d in w.devices for p in d.ports]
        if w.config is None or w.plan is None:
            why = no_config or "no readable tenants file to derive the expected tables from"
            checks = smcheck.check_ports(ports, why, read)
        else:
            checks = smcheck.node_checks(w.config, Inventory(rdma=w.devices, rdma_notes=w.notes), w.plan, read,
                                         max_vls)
        by_port = {(c.device, c.port): port_dict(c) for c in checks}
        return lambda p: by_port.get((p.device, p.port))

    return bind


@dataclass(frozen=True)
class SmCheckSettings:
    # The SM reprograms these tables only on a heavy sweep (topology change, SIGHUP, restart), and
    # each read is two SMPs the HCA's SMA answers: once a minute notices a change within a few scrapes.
    interval_s: float = 60.0
    # Per smpquery call; a port takes at most two (SL2VL, VLArb). A local SMP answers in milliseconds.
    timeout_s: float = 10.0
    max_vls: MaxVls = DEFAULT_MAX_VLS


@dataclass(frozen=True)
class SmCheckSnapshot:
    checks: tuple[smcheck.PortCheck, ...] = ()
    taken_at: float | None = None  # wall clock of the last check
    runs: int = 0
    # (device, port) -> checks that could not read the port, since start
    errors: Mapping[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Inputs:
    config: Config
    inventory: Inventory
    plan: object  # backends.rdma.plan.RdmaPlan


def kernel_reader(settings: SmCheckSettings) -> Read:
    """The real reader: smpquery through kernel/ib_smp.py, each call with the settings' deadline."""
    from shaperd.kernel import ib_smp

    return ib_smp.reader(timeout_s=settings.timeout_s)


class SmChecker(Periodic):
    """Checks the node's InfiniBand ports every ``interval_s``; ``tick(now)`` is the whole schedule."""

    thread_name = "shaperd-rdma-smcheck"

    def __init__(self, read: Read, settings: SmCheckSettings = SmCheckSettings(), clock=time.monotonic,
                 wall=time.time):
        self.read, self.settings = read, settings
        self.clock, self.wall = clock, wall
        self.snapshot = SmCheckSnapshot()
        self._inputs: _Inputs | None = None
        self._next: float | None = None  # None: check at the first tick that has inputs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = log.get("shaperd.rdma_smcheck")

    def set_inputs(self, cfg: Config, inv: Inventory, rplan) -> None:
        """From the daemon after each reconcile: the config, inventory and RDMA plan (one reference swap)."""
        self._inputs = _Inputs(cfg, inv, rplan)

    def tick(self, now: float) -> bool:
        """Check if due; True if a check ran."""
        if self._inputs is None or (self._next is not None and now < self._next):
            return False
        self._next = now + self.settings.interval_s
        self.check_once()
        return True

    def check_once(self) -> SmCheckSnapshot:
        inp, prev = self._inputs, self.snapshot
        if inp is None:
            return prev
        try:
            checks = smcheck.node_checks(inp.config, inp.inventory, inp.plan, self.read, self.settings.max_vls)
        except Exception as e:  # noqa: BLE001 - a bug here must not kill the thread; no series, a log line
            self.log.error("SM table check failed", error=str(e))
            checks = ()
        errors = dict(prev.errors)
        for c in checks:
            if not c.verified:
                errors[(c.device, c.port)] = errors.get((c.device, c.port), 0) + 1
            elif not c.ok and c.describe() not in {p.describe() for p in prev.checks}:
                self.log.warning("SM tables differ from the tenants file", port=c.ref,
                                 mismatches=[str(m) for m in c.mismatches])
        self.snapshot = SmCheckSnapshot(tuple(checks), self.wall(), prev.runs + 1, errors)
        return self.snapshot

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick(self.clock())
            wait = 1.0 if self._next is None else max(0.0, self._next - self.clock())
            self._stop.wait(min(wait, self.settings.interval_s))



def families(snap: SmCheckSnapshot) -> list:
    """The SM-table series: verified and mismatches only for ports that were read; errors as a counter."""
    verified = GaugeMetricFamily("shaperd_rdma_sm_tables_verified", "1 if the port's SL2VL and VL arbitration "
                                 "tables (read with smpquery) are what the tenants file renders, 0 if they differ; "
                                 "absent when they could not be read", labels=["device", "port"])
    mism = GaugeMetricFamily("shaperd_rdma_sm_table_mismatches", "Entries of the port's SM table that differ from "
                             "what the tenants file renders (sl2vl: SLs; vlarb_*: arbitration entries)",
                             labels=["device", "port", "table"])
    fams = {"shaperd_rdma_sm_tables_verified": verified, "shaperd_rdma_sm_table_mismatches": mism}
    for s in smcheck.metric_samples(snap.checks):
        lv = [s.labels["device"], s.labels["port"]] + ([s.labels["table"]] if "table" in s.labels else [])
        fams[s.name].add_metric(lv, s.value)
    errors = CounterMetricFamily("shaperd_rdma_sm_check_errors", "Checks that could not read the port's SM tables "
                                 "(smpquery missing, failing or timing out; not root; port not active)",
                                 labels=["device", "port"])
    for (dev, port), n in sorted(snap.errors.items()):
        errors.add_metric([dev, str(port)], n)
    out = [verified, mism, errors]
    if snap.taken_at is not None:
        out.append(GaugeMetricFamily("shaperd_rdma_sm_last_check_timestamp_seconds", "When the SM tables were last "
                                     "checked", value=snap.taken_at))
    return out
