"""Prometheus series for the RDMA path: per-tenant egress measured on the tenant's RDMA ports.

Two pieces, both reading the RDMA sampler's snapshot (report/rdma_sampler.py),
never sysfs:

* ``WithRdmaPath`` wraps the tenants collector (report/metrics.py) and adds
  the RDMA samples to the families both paths share, so "egress per
  tenant" is one family with a ``path`` label (``tc`` or ``rdma``):
  ``shaperd_tenant_transmit_bytes_total``, ``..._transmit_packets_total``
  and ``..._transmit_rate_bytes_per_second``, labelled
  ``{path="rdma",tenant,device,port}``. The text format allows one HELP/TYPE
  block per name, so the samples go into the tc block rather than a second
  block of the same name.
* ``RdmaCollector``: what only the RDMA path has: port_xmit_wait, the
  driver's hw counters (congestion: np_cnp_sent, rp_cnp_handled,
  out_of_sequence, ...), which counters are saturated, which ports are
  readable, and the sampler's own health.

Only ports a tenant owns (the RDMA plan's ``owners``) have tenant series. A
port that cannot be read has no series (``shaperd_rdma_port_counters_readable``
says 0); a saturated 32-bit counter has none either
(``shaperd_rdma_counter_saturated`` says 1). With an ``SmChecker``
(report/rdma_smcheck.py), ``RdmaCollector`` also yields the SM-table series
from its snapshot. ``install`` puts both into a ``Metrics``; nothing in
report/metrics.py knows about RDMA.
"""

from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from shaperd.report.rdma_sampler import RdmaSampler, RdmaSnapshot

from shaperd.report.collectors import Unhealthy as _Unhealthy

STALE_AFTER_S = 10.0
PATH = "rdma"
PORT_LABELS = ["tenant", "device", "port", "path"]
# (type, family name as the tc collector names it, help, RdmaPortSeries attribute)
SHARED_FAMILIES = (
    ("counter", "shaperd_tenant_transmit_bytes", "Bytes the tenant sent: its HTB class (path=tc, L2 frame length) or "
     "its RDMA ports (path=rdma, port_xmit_data x 4)", "bytes_total"),
    ("counter", "shaperd_tenant_transmit_packets", "Packets the tenant sent: its HTB class (path=tc) or its RDMA "
     "ports (path=rdma, port_xmit_packets)", "packets_total"),
    ("gauge", "shaperd_tenant_transmit_rate_bytes_per_second", "Egress rate over the sampler's rate window (2 s), "
     "bytes per second", "rate_Bps"),
)


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def _fresh(sampler: RdmaSampler | None) -> RdmaSnapshot:
    return sampler.snapshot if sampler is not None else RdmaSnapshot()


def _owned(snap: RdmaSnapshot):
    return [s for s in snap.series if s.readable and s.target.tenant]


def shared_families(snap: RdmaSnapshot) -> list:
    """The RDMA samples of the families shared with the tc path, as prometheus_client families."""
    out = []
    owned = _owned(snap)
    for mtype, name, doc, attr in SHARED_FAMILIES:
        fam = (CounterMetricFamily if mtype == "counter" else GaugeMetricFamily)(name, doc, labels=PORT_LABELS)
        for s in owned:
            v = getattr(s, attr)
            if v is not None:
                fam.add_metric([s.target.tenant, s.target.device, str(s.target.port), PATH], v)
        out.append((mtype, fam))
    return out


class WithRdmaPath(Collector):
    """The tenants collector with the RDMA path's samples added to the families both paths share."""

    def __init__(self, inner, sampler: RdmaSampler | None):
        self.inner, self.sampler = inner, sampler
        self._cached: tuple[RdmaSnapshot, list[tuple[str, str, str]]] | None = None

    def collect(self):
        fams, err = [], None
        try:
            for f in self.inner.collect():
                fams.append(f)
        except Exception as e:  # noqa: BLE001 - re-raised below, after the families read so far
            err = e
        extra = {fam.name: fam for _, fam in shared_families(_fresh(self.sampler))}
        for f in fams:
            if f.name in extra:
                f.samples.extend(extra.pop(f.name).samples)
        yield from fams
        yield from (f for f in extra.values() if f.samples)
        if err is not None:
            raise err

    def _rdma_text(self) -> list[tuple[str, str, str]]:
        """(TYPE line, HELP+TYPE block, sample lines) per shared family, for the current snapshot."""
        snap = _fresh(self.sampler)
        if self._cached is not None and self._cached[0] is snap:
            return self._cached[1]
        out = []
        for mtype, fam in shared_families(snap):
            text = generate_latest(_Families([fam])).decode()
            lines = text.splitlines(keepends=True)
            head = "".join(l for l in lines if l.startswith("#"))
            type_line = next(l for l in lines if l.startswith("# TYPE "))
            out.append((type_line, head, "".join(l for l in lines if not l.startswith("#"))))
        self._cached = (snap, out)
        return out

    def render(self) -> tuple[str, str | None]:
        text, problem = self.inner.render()
        for type_line, head, samples in self._rdma_text():
            if not samples:
                continue
            at = text.find(type_line)
            if at < 0:
                text += head + samples
            else:
                at += len(type_line)
                text = text[:at] + samples + text[at:]
        return text, problem


class RdmaCollector(Collector):
    """Series only the RDMA path has, and the RDMA sampler's health."""

    def __init__(self, sampler: RdmaSampler | None, clock=time.time, sm_checker=None):
        self.sampler, self.clock, self.sm_checker = sampler, clock, sm_checker

    def _problem(self, snap: RdmaSnapshot) -> str | None:
        if self.sampler is None or not snap.ok or snap.taken_at is None or self.clock() - snap.taken_at > STALE_AFTER_S:
            return snap.error or "no recent RDMA counter sample"
        return None

    def collect(self):
        snap = _fresh(self.sampler)
        labels = ["tenant", "device", "port"]
        wait = CounterMetricFamily("shaperd_tenant_rdma_transmit_wait", "Ticks the tenant's RDMA port had data to "
                                   "send but no flow-control credits (port_xmit_wait)", labels=labels)
        hw = CounterMetricFamily("shaperd_tenant_rdma_hw_events", "The driver's hw counters of the tenant's RDMA "
                                 "port (hw_counters/: np_cnp_sent, rp_cnp_handled, out_of_sequence, ...)",
                                 labels=labels + ["counter"])
        for s in _owned(snap):
            lv = [s.target.tenant, s.target.device, str(s.target.port)]
            if s.wait_total is not None:
                wait.add_metric(lv, s.wait_total)
            for name, v in s.hw_totals.items():
                hw.add_metric(lv + [name], v)
        yield wait
        yield hw
        readable = GaugeMetricFamily("shaperd_rdma_port_counters_readable", "1 if the RDMA port's counters could be "
                                     "read at the last sample, 0 if not (its series are then absent)",
                                     labels=["device", "port"])
        saturated = GaugeMetricFamily("shaperd_rdma_counter_saturated", "1 if a 32-bit port counter is stuck at "
                                      "2^32-1 (no extended counters): it is not counted until reset",
                                      labels=["device", "port", "counter"])
        for s in snap.series:
            readable.add_metric([s.target.device, str(s.target.port)], 1 if s.readable else 0)
            for name in s.saturated:
                saturated.add_metric([s.target.device, str(s.target.port), name], 1)
        yield readable
        yield saturated
        sm = CounterMetricFamily("shaperd_rdma_samples", "RDMA counter samples taken", labels=["result"])
        sm.add_metric(["success"], snap.samples)
        sm.add_metric(["failure"], snap.failures)
        yield sm
        if snap.taken_at is not None:
            yield GaugeMetricFamily("shaperd_rdma_last_sample_timestamp_seconds", "When RDMA counters were last read "
                                    "successfully", value=snap.taken_at)
        if self.sm_checker is not None:
            from shaperd.report.rdma_smcheck import families

            yield from families(self.sm_checker.snapshot)
        problem = self._problem(snap)
        if problem:
            raise _Unhealthy(problem)


def install(metrics, sampler: RdmaSampler, sm_checker=None) -> None:
    """Add the RDMA path to a ``report.metrics.Metrics``: shared tenant families, and the ``rdma`` collector."""
    collectors = metrics.collectors.collectors
    collectors["tenants"] = WithRdmaPath(collectors["tenants"], sampler)
    collectors["rdma"] = RdmaCollector(sampler, sm_checker=sm_checker)
