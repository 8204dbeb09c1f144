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

/metrics serves ``Metrics.exposition()``: the tenants collector writes its
text directly (``TenantCollector.render``; 64 tenants on 8 devices are
~5100 series, and building them as prometheus_client objects cost 20-35 ms
per scrape), the agent collector goes through ``generate_latest``. The
registry holds the same collectors and is the reference rendering; the unit
tests check both agree. The tenant text is a function of the snapshot
alone and is kept until the sampler publishes the next one (0.5 s), so a
second scrape of the same snapshot does not render it again; the data is as
old as the snapshot either way.

Every daemon (and every test) builds its own CollectorRegistry.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


# The tenant families: (type, name, help, TenantSeries attribute). One table for both
# renderings (prometheus_client objects in collect(), text in render()), so they cannot drift.
TENANT_LABELS = ("tenant", "device", "path")  # path: "tc" here; report/rdma_metrics.py adds "rdma"
TENANT_FAMILIES = (
    ("counter", "shaperd_tenant_transmit_bytes", "Bytes the tenant's HTB class sent (L2 frame length, as HTB counts)", "bytes"),
    ("counter", "shaperd_tenant_transmit_packets", "Packets the tenant's class sent (GSO segments counted one by one)", "packets"),
    ("gauge", "shaperd_tenant_transmit_rate_bits_per_second", "Egress rate over the sampler's rate window (2 s)", "rate_bps"),
    ("gauge", "shaperd_tenant_guarantee_bits_per_second", "Configured guarantee (HTB rate) on this device", "guarantee_bps"),
    ("gauge", "shaperd_tenant_limit_bits_per_second", "Configured limit (HTB ceil) on this device; capacity if unset", "limit_bps"),
    ("counter", "shaperd_tenant_dropped_packets", "Packets dropped by the tenant's class queue", "drops"),
    ("counter", "shaperd_tenant_overlimits", "Times HTB throttled the class (its overlimits counter)", "overlimits"),
    ("gauge", "shaperd_tenant_backlog_bytes", "Bytes queued in the tenant's class at the last sample", "backlog_bytes"),
    ("counter", "shaperd_tenant_borrowed_bytes", "Bytes sent above the guarantee, summed per sample interval: max(0, sent - guarantee*dt)", "borrowed_bytes"),
    ("counter", "shaperd_tenant_below_guarantee_seconds", "Seconds the class had demand (queue non-empty at both ends of a 0.5 s sample interval) yet sent less than 98% of its guarantee in it", "below_guarantee_s"),
)
_SAMPLES_HELP = "Class-stats samples taken"
_LAST_SUCCESS_HELP = "When class stats were last read successfully"
_DURATION_HELP = "Time the last sample took (all devices)"
_OK_HELP = "1 if the collector read its data, 0 if not (its series are then partial or absent)"
_DUR_HELP = "Time the collector took in this scrape"


# -- text exposition (Prometheus text format 0.0.4, as prometheus_client's generate_latest writes it) --

def escape_label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


_EXACT_INT = 2**53  # below this an int converts to float exactly, and repr(float(v)) == f"{v}.0"


def format_value(v) -> str:
    """prometheus_client's floatToGoString, with a shortcut for the ints most series carry."""
    if type(v) is int and 0 <= v < _EXACT_INT:
        s = str(v)
        if len(s) <= 6:
            return s + ".0"
        mantissa = f"{s[0]}.{s[1:]}0".rstrip("0.")  # as floatToGoString writes repr(float(v)) from 1e6 up
        return f"{mantissa}e+{len(s) - 1:02d}"
    return floatToGoString(v)


def family_header(mtype: str, name: str, doc: str) -> str:
    """HELP and TYPE lines; a counter's exposed name carries ``_total`` (as generate_latest munges it)."""
    if mtype == "counter":
        name += "_total"
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"


def render_family(mtype: str, name: str, doc: str, samples) -> str:
    """One counter or gauge family; ``samples`` are (label text ``{k="v",...}`` or "", value)."""
    head = family_header(mtype, name, doc)
    if mtype == "counter":
        name += "_total"
    fmt = format_value
    return head + "".join([f"{name}{lbl} {fmt(v)}\n" for lbl, v in samples])


def label_text(**labels: str) -> str:
    """``{k="v",...}`` sorted by label name (generate_latest's order), values escaped."""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items())) + "}"


class TenantCollector(Collector):
    """The sampler's snapshot as tenant series.

    ``collect`` yields prometheus_client families (the reference, and the
    registry path); ``render`` writes the same exposition text directly --
    what /metrics serves, because building ~5000 Sample objects per scrape
    for 64 tenants on 8 devices cost 20-35 ms. The text of the tenant
    families depends on the snapshot alone, so it is kept for the snapshot
    it was rendered from: scrapes between two samples (0.5 s apart) reuse it.
    """

    def __init__(self, sampler: Sampler | None, state: AgentState, clock=time.time):
        self.sampler, self.state, self.clock = sampler, state, clock
        self._cached: tuple[Snapshot, str] | None = None

    def _snapshot(self) -> Snapshot:
        return self.sampler.snapshot if self.sampler else Snapshot()

    def _problem(self, snap: Snapshot) -> str | None:
        if self.sampler is None or not snap.ok or snap.taken_at is None or self.clock() - snap.taken_at > STALE_AFTER_S:
            return snap.error or "no recent class-stats sample"
        return None

    def collect(self):
        return self.collect_from(self._snapshot())

    def collect_from(self, snap: Snapshot):
        for mtype, name, doc, attr in TENANT_FAMILIES:
            fam = (CounterMetricFamily if mtype == "counter" else GaugeMetricFamily)(name, doc, labels=list(TENANT_LABELS))
            for s in snap.series:
                v = getattr(s, attr)
                if v is not None:  # rate: unknown until two samples span some time
                    fam.add_metric([s.target.tenant, s.target.device, "tc"], v)
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
            raise _Unhealthy(problem)

    def render(self) -> tuple[str, str | None]:
        """(exposition text of every family ``collect`` yields, why the collector is unhealthy or None)."""
        snap = self._snapshot()
        cached = self._cached
        if cached is not None and cached[0] is snap:
            text = cached[1]
        else:
            text = self.render_snapshot(snap)
            self._cached = (snap, text)
        return text, self._problem(snap)

    @staticmethod
    def render_snapshot(snap: Snapshot) -> str:
        labels = [(f'{{device="{escape_label_value(s.target.device)}",path="tc",tenant="{escape_label_value(s.target.tenant)}"}}', s)
                  for s in snap.series]
        out = []
        for mtype, name, doc, attr in TENANT_FAMILIES:
            samples = [(lbl, v) for lbl, s in labels if (v := getattr(s, attr)) is not None]
            out.append(render_family(mtype, name, doc, samples))
        out.append(render_family("counter", "shaperd_sampler_samples", _SAMPLES_HELP,
                                 [('{result="success"}', snap.samples), ('{result="failure"}', snap.failures)]))
        if snap.taken_at is not None:
            out.append(render_family("gauge", "shaperd_sampler_last_success_timestamp_seconds", _LAST_SUCCESS_HELP,
                                     [("", snap.taken_at)]))
            out.append(render_family("gauge", "shaperd_sampler_duration_seconds", _DURATION_HELP, [("", snap.duration_s)]))
        return "".join(out)


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


class _Families:
    """Already collected families, for generate_latest."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


class _Timed(Collector):
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
        except _Unhealthy as e:  # what was read before is still served
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
                    text = generate_latest(_Families(families)).decode()
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
        self.collectors = _Timed({
            "tenants": TenantCollector(sampler, self.state),
            "agent": AgentCollector(self.state, self.reconcile_seconds),
        }, log.get("shaperd.metrics"))
        self.registry.register(self.collectors)

    def exposition(self) -> bytes:
        """The /metrics body: the registry's families, written without building the tenant samples as objects.

        Only the collectors above are served (the registry is the reference
        rendering of the same families; tests check they agree).
        """
        return self.collectors.exposition()

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
