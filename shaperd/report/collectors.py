"""The two metric collectors, one per concern (node_exporter style), and the wrapper that times them.

``TenantCollector`` turns the sampler's Snapshot into tenant series, and the series of capped pods'
own classes into ``shaperd_pod_transmit_*`` (only pods with an egress cap have one: the cardinality is
two series per capped pod and shaped uplink);
``AgentCollector`` turns health.AgentState into the agent's own series.
Each reads a snapshot at scrape time and never the kernel. A value that is
not known is a missing series, never a zero: no tenant series before the
first sample, no last-success timestamp before a success, no degraded count
before a reconcile has run, no pod count and no Kubernetes sync state
without Kubernetes discovery, no ``shaperd_bpf_syscall_refused`` while bpf() works.

``TimedCollectors`` runs them: each reports its own
``shaperd_scrape_collector_success`` and ``..._duration_seconds``, and a
failing collector never fails the scrape. It renders the same families two
ways: prometheus_client objects (``collect``, the registry's reference
rendering) and text (``exposition``, what /metrics serves; the tenant
families are written directly, because building ~5100 Sample objects for
64 tenants on 8 devices cost 20-35 ms per scrape).

Per-tenant series cover the tenants a ``report.presence.SeriesFilter`` wants: by default those present on
this node (a pod, an address, a host interface, a cgroup or an RDMA device here), every tenant with
``shaperd run --metrics-all-tenants``. A capped pod's own series are always exported (the pod is here).

Must not: change AgentState or the sampler (they are read under their own
lock or as an immutable snapshot).
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from shaperd import __version__
from shaperd.core import buildinfo
from shaperd.report.exposition import Families, escape_label_value, label_text, render_family
from shaperd.report.health import AgentState
from shaperd.report.presence import SeriesFilter
from shaperd.report.sampler import Sampler, Snapshot

# The tenants collector reports failure when its snapshot is older than this.
STALE_AFTER_S = 10.0

# The tenant families: (type, name, help, TenantSeries attribute). One table for both
# renderings (prometheus_client objects in collect(), text in render()), so they cannot drift.
TENANT_LABELS = ("tenant", "device", "path")  # path: "tc" here; report/rdma_metrics.py adds "rdma"
TENANT_FAMILIES = (
    ("counter", "shaperd_tenant_transmit_bytes", "Bytes the tenant's HTB class sent (L2 frame length, as HTB counts)", "bytes"),
    ("counter", "shaperd_tenant_transmit_packets", "Packets the tenant's class sent (GSO segments counted one by one)", "packets"),
    ("gauge", "shaperd_tenant_transmit_rate_bytes_per_second", "Egress rate over the sampler's rate window (2 s), bytes per second", "rate_Bps"),
    ("gauge", "shaperd_tenant_guarantee_bytes_per_second", "Configured guarantee (HTB rate) on this device, bytes per second", "guarantee_Bps"),
    ("gauge", "shaperd_tenant_limit_bytes_per_second", "Configured limit (HTB ceil) on this device, bytes per second; capacity if unset", "limit_Bps"),
    ("counter", "shaperd_tenant_dropped_packets", "Packets dropped by the tenant's class queue", "drops"),
    ("counter", "shaperd_tenant_overlimits", "Times HTB throttled the class (its overlimits counter)", "overlimits"),
    ("gauge", "shaperd_tenant_backlog_bytes", "Bytes queued in the tenant's class at the last sample", "backlog_bytes"),
    ("counter", "shaperd_tenant_borrowed_bytes", "Bytes sent above the guarantee, summed per sample interval: max(0, sent - guarantee*dt)", "borrowed_bytes"),
    ("counter", "shaperd_tenant_below_guarantee_seconds", "Seconds the class had demand (queue non-empty at both ends of a 0.5 s sample interval) yet sent less than 98% of its guarantee in it", "below_guarantee_s"),
)
# The capped pods' own classes (htb; kubernetes.io/egress-bandwidth), from the same snapshot.
POD_LABELS = ("namespace", "pod", "tenant", "device")
POD_FAMILIES = (
    ("counter", "shaperd_pod_transmit_bytes", "Bytes the capped pod's own HTB class sent (L2 frame length, as HTB counts); only pods with kubernetes.io/egress-bandwidth have one", "bytes"),
    ("gauge", "shaperd_pod_transmit_limit_bytes_per_second", "The capped pod's enforced egress cap on this device (its class's HTB ceil: the annotation, at most its tenant's limit), bytes per second", "limit_Bps"),
)
_SAMPLES_HELP = "Class-stats samples taken"
_LAST_SUCCESS_HELP = "When class stats were last read successfully"
_DURATION_HELP = "Time the last sample took (all devices)"
_DEGRADED_HELP = ("What the last reconcile could not enforce, by kind: blocked = a target left alone because it is not "
                  "shaperd's (e.g. a foreign root qdisc on an uplink), problem = the tenants file asks for what this node "
                  "cannot plan (e.g. no capacity known for a device); 0 when everything planned is enforced. Neither is "
                  "retried sooner nor fixed by a restart: /healthz, systemctl status and shaperd status name the first reason")
_BPF_REFUSED_HELP = ("1 while bpf() is refused by what the agent runs under, by cause: seccomp = a seccomp filter "
                     "(the container runtime's RuntimeDefault profile, or a unit's SystemCallFilter=) although CAP_BPF "
                     "or CAP_SYS_ADMIN is held; the eBPF classifier, marks and edt are then off. Absent when bpf() "
                     "works or its refusal has no known cause (docs/kubernetes.md#bpf-refused-by-seccomp)")
# Capabilities.bpf_refused -> the cause label of shaperd_bpf_syscall_refused.
REFUSAL_CAUSES = {"bpf_refused_by_seccomp": "seccomp"}
_OK_HELP = "1 if the collector read its data, 0 if not (its series are then partial or absent)"
_DUR_HELP = "Time the collector took in this scrape"


class TenantCollector(Collector):
    """The sampler's snapshot as tenant series.

    ``collect`` yields prometheus_client families (the reference, and the
    registry path); ``render`` writes the same exposition text directly --
    what /metrics serves, because building ~5000 Sample objects per scrape
    for 64 tenants on 8 devices cost 20-35 ms. The text of the tenant
    families depends on the snapshot alone, so it is kept for the snapshot
    it was rendered from: scrapes between two samples (0.5 s apart) reuse it.
    """

    def __init__(self, sampler: Sampler | None, clock=time.time, series_filter: SeriesFilter | None = None):
        """``clock``: wall-clock seconds, compared with the snapshot's ``taken_at`` (STALE_AFTER_S);
        ``series_filter``: which tenants' series to export (None: every tenant's)."""
        self.sampler, self.clock = sampler, clock
        self.filter = series_filter if series_filter is not None else SeriesFilter(all_tenants=True)
        self._cached: tuple[Snapshot, frozenset[str] | None, str] | None = None

    def _snapshot(self) -> Snapshot:
        return self.sampler.snapshot if self.sampler else Snapshot()

    def _problem(self, snap: Snapshot) -> str | None:
        if self.sampler is None or not snap.ok or snap.taken_at is None or self.clock() - snap.taken_at > STALE_AFTER_S:
            return snap.error or "no recent class-stats sample"
        return None

    def collect(self):
        return self.collect_from(self._snapshot())

    def collect_from(self, snap: Snapshot):
        tenants = [s for s in snap.series if not s.target.pod and self.filter.wanted(s.target.tenant)]
        for mtype, name, doc, attr in TENANT_FAMILIES:
            fam = (CounterMetricFamily if mtype == "counter" else GaugeMetricFamily)(name, doc, labels=list(TENANT_LABELS))
            for s in tenants:
                v = getattr(s, attr)
                if v is not None:  # rate: unknown until two samples span some time
                    fam.add_metric([s.target.tenant, s.target.device, "tc"], v)
            yield fam
        pods = [s for s in snap.series if s.target.pod]
        for mtype, name, doc, attr in POD_FAMILIES:
            fam = (CounterMetricFamily if mtype == "counter" else GaugeMetricFamily)(name, doc, labels=list(POD_LABELS))
            for s in pods:
                ns, _, pod = s.target.pod.partition("/")
                fam.add_metric([ns, pod, s.target.tenant, s.target.device], getattr(s, attr))
            yield fam
        sm = CounterMetricFamily("shaperd_sampler_samples", _SAMPLES_HELP, labels=["result"])
        sm.add_metric(["success"], snap.samples)
        sm.add_metric(["failure"], snap.failures)
        yield sm
        if snap.taken_at is not None:
            yield GaugeMetricFamily("shaperd_sampler_last_success_timestamp_seconds", _LAST_SUCCESS_HELP, value=snap.taken_at)
            yield GaugeMetricFamily("shaperd_sampler_duration_seconds", _DURATION_HELP, value=snap.duration_s)
        problem = self._problem(snap)
        if problem:
            raise Unhealthy(problem)

    def render(self) -> tuple[str, str | None]:
        """(exposition text of every family ``collect`` yields, why the collector is unhealthy or None)."""
        snap = self._snapshot()
        present = self.filter.present
        cached = self._cached
        if cached is not None and cached[0] is snap and cached[1] is present:
            text = cached[2]
        else:
            text = self.render_snapshot(snap, present)
            self._cached = (snap, present, text)
        return text, self._problem(snap)

    @staticmethod
    def render_snapshot(snap: Snapshot, present: frozenset[str] | None = None) -> str:
        """``present``: the tenants whose series are written (None: every tenant)."""
        labels = [(f'{{device="{escape_label_value(s.target.device)}",path="tc",tenant="{escape_label_value(s.target.tenant)}"}}', s)
                  for s in snap.series if not s.target.pod and (present is None or s.target.tenant in present)]
        out = []
        for mtype, name, doc, attr in TENANT_FAMILIES:
            samples = [(lbl, v) for lbl, s in labels if (v := getattr(s, attr)) is not None]
            out.append(render_family(mtype, name, doc, samples))
        pods = [(label_text(namespace=ns, pod=pod, tenant=s.target.tenant, device=s.target.device), s)
                for s in snap.series if s.target.pod for ns, _, pod in (s.target.pod.partition("/"),)]
        for mtype, name, doc, attr in POD_FAMILIES:
            out.append(render_family(mtype, name, doc, [(lbl, getattr(s, attr)) for lbl, s in pods]))
        out.append(render_family("counter", "shaperd_sampler_samples", _SAMPLES_HELP,
                                 [('{result="success"}', snap.samples), ('{result="failure"}', snap.failures)]))
        if snap.taken_at is not None:
            out.append(render_family("gauge", "shaperd_sampler_last_success_timestamp_seconds", _LAST_SUCCESS_HELP,
                                     [("", snap.taken_at)]))
            out.append(render_family("gauge", "shaperd_sampler_duration_seconds", _DURATION_HELP, [("", snap.duration_s)]))
        return "".join(out)


class Unhealthy(Exception):
    """Raised after yielding what is known: the collector's success series reads 0."""


class AgentCollector(Collector):
    """AgentState and the reconcile-duration histogram as the agent's series."""

    def __init__(self, state: AgentState, histogram: Histogram, series_filter: SeriesFilter | None = None):
        self.state, self.hist = state, histogram
        self.filter = series_filter if series_filter is not None else SeriesFilter(all_tenants=True)

    def collect(self):
        st = self.state
        with st.lock:
            yield CounterMetricFamily("shaperd_reconciles", "Reconciles run (start, config change, kernel event, periodic resync)", value=st.reconciles)
            err = CounterMetricFamily("shaperd_reconcile_errors", "Reconciles that hit an error, by kind", labels=["kind"])
            for k, v in st.errors.items():
                err.add_metric([k], v)
            yield err
            yield CounterMetricFamily("shaperd_drift_repairs", "Reconciles that changed the kernel although the config had not changed since the last one (someone else changed tc state)", value=st.drift_repairs)
            if st.last_success_ts is not None:
                yield GaugeMetricFamily("shaperd_last_reconcile_success_timestamp_seconds", "When a reconcile last completed without failed writes or unreadable devices", value=st.last_success_ts)
            rl = CounterMetricFamily("shaperd_config_reloads", "Tenants-file loads, by result", labels=["result"])
            rl.add_metric(["success"], st.reloads_ok)
            rl.add_metric(["failure"], st.reloads_failed)
            yield rl
            if st.last_reload_ok is not None:
                yield GaugeMetricFamily("shaperd_config_last_reload_successful", "1 if the last tenants-file load was accepted, 0 if it was rejected (the last good config stays enforced)", value=1 if st.last_reload_ok else 0)
            if st.tenants is not None:
                yield GaugeMetricFamily("shaperd_config_tenants", "Tenants in the enforced config", value=st.tenants)
            if st.endpoints:
                ep = GaugeMetricFamily("shaperd_tenant_endpoints", "Endpoints mapped to the tenant: configured source prefixes (kind=cidr) and host interfaces matched and enforced now (kind=interface)", labels=["tenant", "kind"])
                for tenant, kinds in sorted(st.endpoints.items()):
                    if not self.filter.wanted(tenant):
                        continue
                    for kind, n in sorted(kinds.items()):
                        ep.add_metric([tenant, kind], n)
                yield ep
            if st.degraded is not None:
                dg = GaugeMetricFamily("shaperd_degraded_targets", _DEGRADED_HELP, labels=["kind"])
                for kind, n in st.degraded.by_kind().items():
                    dg.add_metric([kind], n)
                yield dg
            if st.degraded is not None and st.degraded.refused:  # only while refused: else a missing series
                rf = GaugeMetricFamily("shaperd_bpf_syscall_refused", _BPF_REFUSED_HELP, labels=["cause"])
                for reason in st.degraded.refused:
                    rf.add_metric([REFUSAL_CAUSES.get(reason, reason)], 1)
                yield rf
            if st.k8s_synced is not None:
                yield GaugeMetricFamily("shaperd_kubernetes_synced", "1 while the pod list/watch is in sync with the API server; 0 while it is not (the last known pods stay enforced)", value=1 if st.k8s_synced else 0)
            if st.pods is not None:
                pf = GaugeMetricFamily("shaperd_tenant_pods", "Pods on this node mapped to the tenant", labels=["tenant"])
                for tenant, n in sorted(st.pods.items()):
                    if not self.filter.wanted(tenant):
                        continue
                    pf.add_metric([tenant], n)
                yield pf
        yield from self.hist.collect()
        info = GaugeMetricFamily("shaperd_build_info", "Version and git commit of the running agent",
                                 labels=["version", "commit"])
        info.add_metric([__version__, buildinfo.cached()["commit"] or "unknown"], 1)
        yield info


class TimedCollectors(Collector):
    """Wraps collectors: per-collector success and duration series; a failure never fails the scrape.

    Two renderings of the same families: ``collect`` (prometheus_client
    objects, for a CollectorRegistry) and ``exposition`` (the text /metrics
    serves; a collector with a ``render`` method writes its own text, the
    others go through generate_latest). In ``exposition`` a collector's
    duration includes writing its text.
    """

    def __init__(self, collectors: dict[str, Collector], log):
        self.collectors, self.log = collectors, log

    def _families(self, name: str, c: Collector) -> tuple[list, bool]:
        families = []
        try:
            for m in c.collect():
                families.append(m)
        except Unhealthy as e:  # what was read before is still served
            self.log.debug("collector not healthy", collector=name, reason=str(e))
            return families, False
        except Exception as e:  # noqa: BLE001 - a scrape must still succeed
            self.log.warning("collector failed", collector=name, error=str(e))
            return [], False
        return families, True

    def collect(self):
        ok = GaugeMetricFamily("shaperd_scrape_collector_success", _OK_HELP, labels=["collector"])
        dur = GaugeMetricFamily("shaperd_scrape_collector_duration_seconds", _DUR_HELP, labels=["collector"])
        for name, c in self.collectors.items():
            start = time.perf_counter()
            families, good = self._families(name, c)
            yield from families
            ok.add_metric([name], 1 if good else 0)
            dur.add_metric([name], time.perf_counter() - start)
        yield ok
        yield dur

    def exposition(self) -> bytes:
        parts, ok, dur = [], [], []
        for name, c in self.collectors.items():
            start = time.perf_counter()
            render = getattr(c, "render", None)
            if render is not None:
                try:
                    text, problem = render()
                    good = problem is None
                    if problem:
                        self.log.debug("collector not healthy", collector=name, reason=problem)
                except Exception as e:  # noqa: BLE001 - a scrape must still succeed
                    text, good = "", False
                    self.log.warning("collector failed", collector=name, error=str(e))
            else:
                families, good = self._families(name, c)
                try:
                    text = generate_latest(Families(families)).decode()
                except Exception as e:  # noqa: BLE001 - a family that does not render is a failed collector
                    text, good = "", False
                    self.log.warning("collector failed", collector=name, error=str(e))
            parts.append(text)
            lbl = label_text(collector=name)
            ok.append((lbl, 1 if good else 0))
            dur.append((lbl, time.perf_counter() - start))
        parts.append(render_family("gauge", "shaperd_scrape_collector_success", _OK_HELP, ok))
        parts.append(render_family("gauge", "shaperd_scrape_collector_duration_seconds", _DUR_HELP, dur))
        return "".join(parts).encode()


