"""Prometheus exposition for ``shaperd run``: per-tenant traffic and agent health.

Two collectors, one per concern (node_exporter style), each reading a
snapshot at scrape time and never the kernel: ``tenants`` reads the
sampler's Snapshot, ``agent`` reads AgentState, which the daemon loop
updates. A value that is not known is a missing series, never a zero: no
tenant series before the first sample, no last-success timestamp before a
success, no pod count until there is a pod source (the Kubernetes work), no
Kubernetes sync state until it exists. Each collector reports its own
``shaperd_scrape_collector_success`` and ``..._duration_seconds``; a failing
collector never fails the scrape.

Every daemon (and every test) builds its own CollectorRegistry.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import __version__
from .sampler import Sampler, Snapshot

# Default listen address of the metrics/health endpoint (all interfaces).
DEFAULT_METRICS_ADDRESS = ":9567"
# The tenants collector reports failure when its snapshot is older than this.
STALE_AFTER_S = 10.0
RECONCILE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Kinds of reconcile error (fixed set: label values stay few).
ERROR_KINDS = ("netlink", "discovery", "internal", "device_read", "kernel_write", "foreign_qdisc", "plan")


# How long the pod watch may be out of sync (reconnects, relists) before /readyz says so.
K8S_UNSYNCED_GRACE_S = 30.0


@dataclass
class AgentState:
    """What the daemon loop records; read by the agent collector and the health endpoints."""

    reconciles: int = 0
    errors: dict[str, int] = field(default_factory=lambda: {k: 0 for k in ERROR_KINDS})
    drift_repairs: int = 0
    last_success_ts: float | None = None
    last_reconcile_ok: bool | None = None
    reloads_ok: int = 0
    reloads_failed: int = 0
    last_reload_ok: bool | None = None
    config_loaded: bool = False
    tenants: int | None = None
    endpoints: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant -> kind -> n
    # Kubernetes discovery: None when the agent does not watch pods.
    k8s_synced: bool | None = None
    k8s_unsynced_since: float | None = None
    k8s_error: str | None = None
    pods: dict[str, int] | None = None  # tenant -> pods mapped to it (only with Kubernetes discovery)
    last_tick_mono: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class TenantCollector(Collector):
    def __init__(self, sampler: Sampler | None, state: AgentState, clock=time.time):
        self.sampler, self.state, self.clock = sampler, state, clock

    def collect(self):
        snap: Snapshot = self.sampler.snapshot if self.sampler else Snapshot()
        L = ["tenant", "device"]
        f = {
            "bytes": CounterMetricFamily("shaperd_tenant_transmit_bytes", "Bytes the tenant's HTB class sent (L2 frame length, as HTB counts)", labels=L),
            "packets": CounterMetricFamily("shaperd_tenant_transmit_packets", "Packets the tenant's class sent (GSO segments counted one by one)", labels=L),
            "rate": GaugeMetricFamily("shaperd_tenant_transmit_rate_bits_per_second", "Egress rate over the sampler's rate window (2 s)", labels=L),
            "guar": GaugeMetricFamily("shaperd_tenant_guarantee_bits_per_second", "Configured guarantee (HTB rate) on this device", labels=L),
            "limit": GaugeMetricFamily("shaperd_tenant_limit_bits_per_second", "Configured limit (HTB ceil) on this device; capacity if unset", labels=L),
            "drops": CounterMetricFamily("shaperd_tenant_dropped_packets", "Packets dropped by the tenant's class queue", labels=L),
            "over": CounterMetricFamily("shaperd_tenant_overlimits", "Times HTB throttled the class (its overlimits counter)", labels=L),
            "backlog": GaugeMetricFamily("shaperd_tenant_backlog_bytes", "Bytes queued in the tenant's class at the last sample", labels=L),
            "borrowed": CounterMetricFamily("shaperd_tenant_borrowed_bytes", "Bytes sent above the guarantee, summed per sample interval: max(0, sent - guarantee*dt)", labels=L),
            "below": CounterMetricFamily("shaperd_tenant_below_guarantee_seconds", "Seconds the class had demand (queue non-empty at both ends of a 0.5 s sample interval) yet sent less than 98% of its guarantee in it", labels=L),
        }
        for s in snap.series:
            lv = [s.target.tenant, s.target.device]
            f["bytes"].add_metric(lv, s.bytes)
            f["packets"].add_metric(lv, s.packets)
            if s.rate_bps is not None:
                f["rate"].add_metric(lv, s.rate_bps)
            f["guar"].add_metric(lv, s.guarantee_bps)
            f["limit"].add_metric(lv, s.limit_bps)
            f["drops"].add_metric(lv, s.drops)
            f["over"].add_metric(lv, s.overlimits)
            f["backlog"].add_metric(lv, s.backlog_bytes)
            f["borrowed"].add_metric(lv, s.borrowed_bytes)
            f["below"].add_metric(lv, s.below_guarantee_s)
        yield from f.values()
        sm = CounterMetricFamily("shaperd_sampler_samples", "Class-stats samples taken", labels=["result"])
        sm.add_metric(["success"], snap.samples)
        sm.add_metric(["failure"], snap.failures)
        yield sm
        if snap.taken_at is not None:
            yield GaugeMetricFamily("shaperd_sampler_last_success_timestamp_seconds",
                                    "When class stats were last read successfully", value=snap.taken_at)
            yield GaugeMetricFamily("shaperd_sampler_duration_seconds", "Time the last sample took (all devices)",
                                    value=snap.duration_s)
        if self.sampler is None or not snap.ok or snap.taken_at is None or self.clock() - snap.taken_at > STALE_AFTER_S:
            raise _Unhealthy(snap.error or "no recent class-stats sample")


class _Unhealthy(Exception):
    """Raised after yielding what is known: the collector's success series reads 0."""


class AgentCollector(Collector):
    def __init__(self, state: AgentState, histogram: Histogram):
        self.state, self.hist = state, histogram

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
                    for kind, n in sorted(kinds.items()):
                        ep.add_metric([tenant, kind], n)
                yield ep
            if st.k8s_synced is not None:
                yield GaugeMetricFamily("shaperd_kubernetes_synced", "1 while the pod list/watch is in sync with the API server; 0 while it is not (the last known pods stay enforced)", value=1 if st.k8s_synced else 0)
            if st.pods is not None:
                pf = GaugeMetricFamily("shaperd_tenant_pods", "Pods on this node mapped to the tenant", labels=["tenant"])
                for tenant, n in sorted(st.pods.items()):
                    pf.add_metric([tenant], n)
                yield pf
        yield from self.hist.collect()
        info = GaugeMetricFamily("shaperd_build_info", "Version of the running agent", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


class _Timed(Collector):
    """Wraps collectors: per-collector success and duration series; a failure never fails the scrape."""

    def __init__(self, collectors: dict[str, Collector], log):
        self.collectors, self.log = collectors, log

    def collect(self):
        ok = GaugeMetricFamily("shaperd_scrape_collector_success", "1 if the collector read its data, 0 if not (its series are then partial or absent)", labels=["collector"])
        dur = GaugeMetricFamily("shaperd_scrape_collector_duration_seconds", "Time the collector took in this scrape", labels=["collector"])
        for name, c in self.collectors.items():
            start = time.perf_counter()
            good = True
            families = []
            try:
                for m in c.collect():
                    families.append(m)
            except _Unhealthy as e:  # what was read before is still served
                good = False
                self.log.debug("collector not healthy", collector=name, reason=str(e))
            except Exception as e:  # noqa: BLE001 - a scrape must still succeed
                good = False
                families = []
                self.log.warning("collector failed", collector=name, error=str(e))
            yield from families
            ok.add_metric([name], 1 if good else 0)
            dur.add_metric([name], time.perf_counter() - start)
        yield ok
        yield dur


class Metrics:
    """The daemon's registry and the hooks the loop calls."""

    def __init__(self, sampler: Sampler | None, registry: CollectorRegistry | None = None):
        from .. import log

        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.state = AgentState()
        self.sampler = sampler
        # The histogram is not registered on its own: the agent collector yields it.
        self.reconcile_seconds = Histogram("shaperd_reconcile_duration_seconds", "Time one reconcile took",
                                           buckets=RECONCILE_BUCKETS_S, registry=None)
        self.registry.register(_Timed({
            "tenants": TenantCollector(sampler, self.state),
            "agent": AgentCollector(self.state, self.reconcile_seconds),
        }, log.get("shaperd.metrics")))

    # -- hooks called by the daemon loop ------------------------------
    def tick(self) -> None:
        self.state.last_tick_mono = time.monotonic()

    def config_loaded(self, ok: bool, cfg=None) -> None:
        with self.state.lock:
            if ok:
                self.state.reloads_ok += 1
                self.state.config_loaded = True
                if cfg is not None:
                    self.state.tenants = len(cfg.tenants)
            else:
                self.state.reloads_failed += 1
            self.state.last_reload_ok = ok

    def reconciled(self, duration_s: float, error_kinds: set[str], ok: bool, drift: bool,
                   endpoints: dict[str, dict[str, int]] | None = None) -> None:
        self.reconcile_seconds.observe(duration_s)
        with self.state.lock:
            self.state.reconciles += 1
            for k in error_kinds:
                self.state.errors[k] = self.state.errors.get(k, 0) + 1
            if drift:
                self.state.drift_repairs += 1
            self.state.last_reconcile_ok = ok
            if ok:
                self.state.last_success_ts = time.time()
            if endpoints is not None:
                self.state.endpoints = endpoints

    def kubernetes(self, synced: bool, error: str | None, pods: dict[str, int] | None = None) -> None:
        with self.state.lock:
            if synced:
                self.state.k8s_unsynced_since = None
            elif self.state.k8s_synced is not False or self.state.k8s_unsynced_since is None:
                self.state.k8s_unsynced_since = time.monotonic()
            self.state.k8s_synced, self.state.k8s_error = synced, error
            if pods is not None:
                self.state.pods = pods

    # -- health -------------------------------------------------------
    def healthy(self, max_tick_age_s: float = 10.0) -> tuple[bool, str]:
        age = time.monotonic() - self.state.last_tick_mono
        return (age <= max_tick_age_s, f"loop last ticked {age:.1f}s ago")

    def ready(self) -> tuple[bool, str]:
        st = self.state
        if not st.config_loaded:
            return False, "no tenants file loaded yet"
        if st.last_reconcile_ok is None:
            return False, "no reconcile yet"
        if not st.last_reconcile_ok:
            return False, "the last reconcile failed"
        # A brief watch reconnect is normal; not in sync for longer means the pod mapping may be stale.
        if st.k8s_synced is False and st.k8s_unsynced_since is not None \
                and time.monotonic() - st.k8s_unsynced_since > K8S_UNSYNCED_GRACE_S:
            return False, f"pod watch not in sync with the API server: {st.k8s_error or 'reconnecting'}"
        return True, "ok"


def report_error_kinds(rep) -> set[str]:
    """Which kinds of error a reconciler Report carries."""
    kinds = set()
    if rep.plan.problems:
        kinds.add("plan")
    for d in rep.devices:
        if d.error:
            kinds.add("device_read")
        if d.failed:
            kinds.add("kernel_write")
        if d.blocked:
            kinds.add("foreign_qdisc")
    return kinds


def exception_kind(e: Exception) -> str:
    from ..errors import DiscoveryError, KernelError

    if isinstance(e, KernelError):
        return "netlink"
    if isinstance(e, DiscoveryError):
        return "discovery"
    return "internal"
