"""The startup taint: once this node's tenants are enforced, take ``shaperd.io/agent-not-ready`` off it.

Node bootstrap registers the node with ``shaperd.io/agent-not-ready:NoSchedule`` (docs/kubernetes.md,
"The startup taint"), so nothing is scheduled onto a node before its bandwidth is shaped. With
``shaperd run --remove-taint KEY[:EFFECT]`` the daemon calls ``enforced()`` after a reconcile that
*enforced the tenants*: ``rec.apply`` returned a report (it ran: a valid tenants file, the first pod
list synced, the node read) and no device failed (no write refused, no target unreadable). A
degraded reconcile (a plan problem, a root qdisc shaperd does not own and leaves alone) counts: it
is reported in STATUS= and a gauge, and retrying changes nothing. The first such reconcile wakes a
thread of its own here, which removes the taint (discovery/kubernetes/nodes.py: a read, then a
JSON patch that tests the taint at its index and removes it) and then ends: once per process.

Never blocks enforcement: the loop only sets an event. API errors are retried with the watchers'
backoff (0.5 s doubling to 30 s, jittered), a conflict (the taints changed between read and patch)
at once, a few times, before backing off. An absent taint sends no write. Said once in the log
("startup taint removed" / "startup taint absent") and in ``state`` (for the metrics collector).
A taint added again later (by hand) is not removed again: that is an operator's decision.

Must not: reconcile, or decide what "enforced" means beyond the call the daemon makes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from shaperd.core import log
from shaperd.discovery.kubernetes.backoff import Backoff
from shaperd.discovery.kubernetes.errors import Conflict, KubernetesError
from shaperd.discovery.kubernetes.nodes import TaintRef, remove_taint

DEFAULT_TAINT = "shaperd.io/agent-not-ready"
# A conflict is somebody else's edit of the same node's taints: read again at once, this many times,
# before counting it as a failure to back off from.
CONFLICT_RETRIES = 5

_log = log.get("shaperd.taint")


def parse_taint(text: str) -> TaintRef:
    """``KEY`` or ``KEY:EFFECT`` (NoSchedule, PreferNoSchedule, NoExecute; default NoSchedule)."""
    key, sep, effect = text.partition(":")  # a taint key has no ':' (a DNS prefix and '/' at most)
    if not sep:
        effect = "NoSchedule"
    if not key or "=" in key or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise ValueError(f"expected KEY[:NoSchedule|PreferNoSchedule|NoExecute], got {text!r}")
    return TaintRef(key, effect)


class StartupTaint:
    """Removes one taint from this node, once, after the first enforcing reconcile (``enforced()``)."""

    def __init__(self, node_name: str, taint: TaintRef, *, kubeconfig: str | None = None,
                 client_configuration: Any = None, request_timeout_s: float = 10.0, backoff: Backoff = Backoff(),
                 rng: random.Random | None = None, wait: Callable[[float], object] | None = None):
        self.node_name = node_name
        self.taint = taint
        self._kubeconfig = kubeconfig
        self._cfg = client_configuration
        self.request_timeout_s = request_timeout_s
        self.backoff = backoff
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # "waiting" (no enforcing reconcile yet), "removing" (trying), "removed", "absent" (nothing to do),
        # "stopped" (shut down before it was done).
        self.state = "waiting"
        self.attempts = 0
        self.last_error: str | None = None
        self.done = threading.Event()

    def enforced(self) -> None:
        """The daemon's loop: a reconcile enforced the tenants. Starts the removal once; returns at once."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self.state = "removing"
            self._thread = threading.Thread(target=self._run, name="shaperd-startup-taint", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if not self.done.is_set():
            self.state = "stopped"

    def _api(self):
        from shaperd.discovery.kubernetes import api as k8s_api
        from shaperd.discovery.kubernetes.client import load_client_config

        if self._cfg is None:
            self._cfg = load_client_config(self._kubeconfig)
        return k8s_api.api_client(self._cfg)

    def _run(self) -> None:
        failures = conflicts = 0
        api = None
        while not self._stop.is_set():
            self.attempts += 1
            try:
                if api is None:
                    api = self._api()
                removed = remove_taint(api, self.node_name, self.taint, self.request_timeout_s)
            except Conflict as e:
                conflicts += 1
                self.last_error = str(e)
                if conflicts <= CONFLICT_RETRIES:
                    _log.info("startup taint changed under us; reading the node again", node=self.node_name,
                              taint=str(self.taint), error=str(e))
                    continue
                failures = self._failed(e, failures)
                conflicts = 0
            except KubernetesError as e:
                failures = self._failed(e, failures)
            except Exception as e:  # noqa: BLE001 - the thread says what broke and goes on; never the loop's
                failures = self._failed(e, failures)
            else:
                self.state = "removed" if removed else "absent"
                self.last_error = None
                if removed:
                    _log.info("startup taint removed: the tenants are enforced", node=self.node_name,
                              taint=str(self.taint), attempts=self.attempts)
                else:
                    _log.info("startup taint absent; nothing to remove", node=self.node_name, taint=str(self.taint))
                self.done.set()
                return

    def _failed(self, e: BaseException, failures: int) -> int:
        delay = self.backoff.delay_s(failures, self._rng)
        self.last_error = str(e)
        _log.warning("removing the startup taint failed; enforcement goes on, retrying", node=self.node_name,
                     taint=str(self.taint), error=str(e), attempt=self.attempts, retry_in_s=round(delay, 2))
        self._wait(delay)
        return failures + 1

    def collector(self):
        """A prometheus collector: ``shaperd_startup_taint_removed`` 1 once the taint is off (or was absent)."""
        return _Collector(self)


class _Collector:  # a prometheus_client Collector (collect() only), registered by the daemon
    def __init__(self, owner: StartupTaint):
        self.owner = owner

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily("shaperd_startup_taint_removed",
                              "1 once this node's startup taint is off (removed by the agent, or absent); "
                              "0 while it is waiting for the first enforcing reconcile or retrying",
                              labels=["taint"])
        o = self.owner
        g.add_metric([str(o.taint)], 1.0 if o.state in ("removed", "absent") else 0.0)
        yield g
