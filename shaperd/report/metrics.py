"""Prometheus metrics and health for ``shaperd run``: the registry and the hooks the daemon loop calls.

``Metrics`` wires the pieces, each in its own module:

- ``collectors``: the tenants and agent collectors and the wrapper that
  times them (per-collector success and duration series);
- ``exposition``: the text format the tenants collector writes directly;
- ``health``: ``AgentState``, what the loop recorded, and healthy/ready;
- ``error_kinds``: which kind of error a reconcile hit;
- ``presence``: which tenants are present on the node, whose series are
  exported by default (``all_tenants=False``; the daemon's default);
- prometheus_client's process and platform collectors (``process_*``, ``python_info``).

/metrics serves ``Metrics.exposition()``. The registry holds the same
collectors and is the reference rendering; the unit tests check both
agree. The tenant text is a function of the sampler's snapshot alone and is
kept until the sampler publishes the next one (0.5 s), so a second scrape
of the same snapshot does not render it again.

Every daemon (and every test) builds its own CollectorRegistry. Clocks are
arguments, so a test can put the agent at any instant.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector

from shaperd.report.collectors import AgentCollector, TenantCollector, TimedCollectors
from shaperd.report.error_kinds import exception_kind, report_error_kinds
from shaperd.report.health import MAX_TICK_AGE_S, AgentState
from shaperd.report.presence import SeriesFilter
from shaperd.report.sampler import Sampler

__all__ = ["DEFAULT_METRICS_ADDRESS", "Metrics", "exception_kind", "report_error_kinds"]

# Default listen address of the metrics/health endpoint (all interfaces).
DEFAULT_METRICS_ADDRESS = ":9567"
RECONCILE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The daemon's registry and the hooks the loop calls.

    ``wall``: wall-clock seconds (timestamps, snapshot staleness);
    ``monotonic``: seconds for ages (loop ticks, time out of sync).
    """

    def __init__(self, sampler: Sampler | None, registry: CollectorRegistry | None = None, *,
                 wall=time.time, monotonic=time.monotonic, all_tenants: bool = True):
        """``all_tenants``: export every tenant's series (``--metrics-all-tenants``); False: only the tenants
        ``present`` names (the daemon's default, report/presence.py)."""
        from shaperd.core import log

        self._wall, self._mono = wall, monotonic
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.state = AgentState(last_tick_mono=monotonic())
        self.sampler = sampler
        # Which tenants' series are exported; backend collectors read it too (``metrics.series_filter``).
        self.series_filter = SeriesFilter(all_tenants=all_tenants)
        # The histogram is not registered on its own: the agent collector yields it.
        self.reconcile_seconds = Histogram("shaperd_reconcile_duration_seconds", "Time one reconcile took",
                                           buckets=RECONCILE_BUCKETS_S, registry=None)
        self.collectors = TimedCollectors({
            "tenants": TenantCollector(sampler, clock=wall, series_filter=self.series_filter),
            "agent": AgentCollector(self.state, self.reconcile_seconds, self.series_filter),
            # process_* (CPU, RSS, fds, start time: /proc/self) and python_info, as every client library exposes.
            "process": ProcessCollector(registry=None),
            "platform": PlatformCollector(registry=None),
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
        self.state.tick(self._mono())

    def config_loaded(self, ok: bool, cfg=None) -> None:
        self.state.record_config(ok, len(cfg.tenants) if cfg is not None else None)

    def reconciled(self, duration_s: float, error_kinds: set[str], ok: bool, drift: bool,
                   endpoints: dict[str, dict[str, int]] | None = None, degraded=None) -> None:
        """``degraded``: report.degraded.Degraded of this reconcile (None: not known, the last one stays)."""
        self.reconcile_seconds.observe(duration_s)
        self.state.record_reconcile(error_kinds, ok, drift, self._wall(), endpoints, degraded)

    def present(self, tenants: frozenset[str]) -> None:
        """The tenants present on the node after a reconcile: their series appear from the next scrape on."""
        self.series_filter.set_present(tenants)

    def kubernetes(self, synced: bool, error: str | None, pods: dict[str, int] | None = None) -> None:
        self.state.record_kubernetes(synced, error, self._mono(), pods)

    # -- health -------------------------------------------------------
    def healthy(self, max_tick_age_s: float = MAX_TICK_AGE_S) -> tuple[bool, str]:
        return self.state.healthy(self._mono(), max_tick_age_s)

    def ready(self) -> tuple[bool, str]:
        return self.state.ready(self._mono())
