"""What the daemon loop did, and whether the agent is alive (/healthz) and ready (/readyz).

Owns ``AgentState``: the loop's bookkeeping (reconciles, errors by kind,
drift repairs, config reloads, Kubernetes sync state, pods and endpoints
per tenant, what the last reconcile could not enforce) and the two health
verdicts read from it. Time comes in as
arguments (monotonic for ages, wall clock for timestamps), so every
verdict can be tested at any instant without waiting.

A degraded node (report/degraded.py: a plan problem, a target left alone)
stays alive and ready: both verdicts keep their answer and add the degraded
line to their reason. Liveness failing would restart an agent that a restart
cannot help (a foreign qdisc stays), and readiness failing would stall a
DaemonSet rollout on that node for good; the ``shaperd_degraded_targets``
gauge and its alert are how degraded is acted on.

Must not: render metrics (collectors.AgentCollector reads this state) or
decide anything for the loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from shaperd.report.degraded import Degraded
from shaperd.report.error_kinds import ERROR_KINDS

# /healthz fails when the loop has not ticked for this long: it ticks at least
# once a second while idle (its file poll), so 10 s is a stuck loop.
MAX_TICK_AGE_S = 10.0
# How long the pod watch may be out of sync (reconnects, relists) before /readyz says so.
K8S_UNSYNCED_GRACE_S = 30.0


@dataclass
class AgentState:
    """What the daemon loop records; read by the agent collector and the health endpoints.

    A field that is None is not known (no such source, or not happened yet):
    its series is left out, never reported as zero.
    """

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
    degraded: Degraded | None = None  # what the last reconcile that ran could not enforce; None before one
    last_tick_mono: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- bookkeeping (called from the daemon loop through Metrics) ----------

    def tick(self, now_mono: float) -> None:
        self.last_tick_mono = now_mono

    def record_config(self, ok: bool, tenants: int | None = None) -> None:
        """A tenants-file load; ``tenants``: how many the accepted file has (None: unchanged)."""
        with self.lock:
            if ok:
                self.reloads_ok += 1
                self.config_loaded = True
                if tenants is not None:
                    self.tenants = tenants
            else:
                self.reloads_failed += 1
            self.last_reload_ok = ok

    def record_reconcile(self, error_kinds: set[str], ok: bool, drift: bool, now_wall: float,
                         endpoints: dict[str, dict[str, int]] | None = None, degraded: Degraded | None = None) -> None:
        """``degraded``: what this reconcile could not enforce (None: not known, e.g. it raised; the last stays)."""
        with self.lock:
            self.reconciles += 1
            for k in error_kinds:
                self.errors[k] = self.errors.get(k, 0) + 1
            if drift:
                self.drift_repairs += 1
            self.last_reconcile_ok = ok
            if ok:
                self.last_success_ts = now_wall
            if endpoints is not None:
                self.endpoints = endpoints
            if degraded is not None:
                self.degraded = degraded

    def record_kubernetes(self, synced: bool, error: str | None, now_mono: float,
                          pods: dict[str, int] | None = None) -> None:
        with self.lock:
            if synced:
                self.k8s_unsynced_since = None
            elif self.k8s_synced is not False or self.k8s_unsynced_since is None:
                self.k8s_unsynced_since = now_mono  # the start of this out-of-sync spell
            self.k8s_synced, self.k8s_error = synced, error
            if pods is not None:
                self.pods = pods

    # -- verdicts -------------------------------------------------------------

    def healthy(self, now_mono: float, max_tick_age_s: float = MAX_TICK_AGE_S) -> tuple[bool, str]:
        age = now_mono - self.last_tick_mono
        return (age <= max_tick_age_s, _with_degraded(f"loop last ticked {age:.1f}s ago", self.degraded))

    def ready(self, now_mono: float) -> tuple[bool, str]:
        with self.lock:
            if not self.config_loaded:
                return False, "no tenants file loaded yet"
            if self.last_reconcile_ok is None:
                return False, "no reconcile yet"
            if not self.last_reconcile_ok:
                return False, "the last reconcile failed"
            # A brief watch reconnect is normal; not in sync for longer means the pod mapping may be stale.
            if self.k8s_synced is False and self.k8s_unsynced_since is not None \
                    and now_mono - self.k8s_unsynced_since > K8S_UNSYNCED_GRACE_S:
                return False, f"pod watch not in sync with the API server: {self.k8s_error or 'reconnecting'}"
            return True, self.degraded.line() if self.degraded else "ok"


def _with_degraded(why: str, degraded: Degraded | None) -> str:
    return f"{why}; {degraded.line()}" if degraded else why
