"""``shaperd run``: keep the node's tc state equal to the tenants file.

Reconciles at start, when the tenants file changes (polled by inode, mtime
and size through the symlink, which also catches a ConfigMap's atomic
``..data`` swap), on SIGHUP, when links or tc objects change (debounced),
and on a periodic resync that repairs drift. A bad new file is rejected with
a log line and the last good one stays enforced. When and how the file is
read (settle time, torn reads, unchanged bytes) is engine/config_watch.py's. SIGTERM/SIGINT end the
loop and leave enforcement in place.

With a metrics address, a sampler thread reads class counters every 0.5 s
(report/sampler.py) and an HTTP thread serves /metrics, /healthz and /readyz
(report/); the loop only records what it did. A third thread checks the
SM's SL2VL/VLArb tables on the node's InfiniBand ports every 60 s
(report/rdma_smcheck.py, smpquery through kernel/ib_smp.py).

With Kubernetes, the kubelet's pod-resources socket is looked at on the
same file-poll tick: a socket that appears or is replaced (kubelet restart)
reconnects the client and triggers a reconcile (discovery/podresources/).

What the node is told (systemd, report/sdnotify.py; the same words on
/healthz and /readyz): READY=1 once the first reconcile *ran*, i.e.
``rec.apply`` returned a report: it applied, found the node in sync, or did
what it could (a failing or degraded node is ready and says which in
STATUS=). Until then STATUS= says what that first reconcile waits for: a
valid tenants file, the first pod list, the Cilium or Volcano lists, reading
the node, or the error of the last attempt. A node that never gets that far
never becomes ready: systemd fails the start after TimeoutStartSec (90 s in
systemd/shaperd.service) and restarts it, so an agent that cannot even read
the node is not reported as started. After READY=1, STATUS= follows every
change: "N tenants, M reconciles, in sync", "failing", or "degraded: ..."
(report/degraded.py): a plan problem or a target left alone (a root qdisc
that is not shaperd's), with the count and the first reason; the
``shaperd_degraded_targets`` gauge carries the count. Degraded is not a
failure: it is not retried sooner, and the watchdog stays fed (a restart
does not remove a foreign qdisc). Only a loop that stops (hangs) or whose
reconciles fail WATCHDOG_MAX_FAILURES times in a row stops feeding it.

Start-up registers each component's stop on one ExitStack (``run``), so
shutdown is the reverse of start-up and one stop that raises does not keep
the others from stopping.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

from shaperd.core import log
from shaperd.core.config import Config, load_text
from shaperd.core.errors import ConfigError, KernelError, ShaperdError
from shaperd.engine.config_watch import ConfigWatch
from shaperd.report.degraded import of_report as degraded_of

FILE_POLL_S = 1.0
# Coalesce a burst of link/tc events (including the echo of our own writes) into one reconcile.
EVENT_DEBOUNCE_S = 0.2
# After a failed reconcile (e.g. netlink error), retry sooner than the resync period.
RETRY_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
# Pod events: a short coalescing window keeps "classified within 1 s of the API event".
POD_DEBOUNCE_S = 0.05
# systemd's watchdog (report/sdnotify.py) is fed only while fewer reconciles than this failed in a
# row: with RETRY_BACKOFF_S that is about 4 minutes of failing before systemd restarts the agent.
WATCHDOG_MAX_FAILURES = 10
# How long a first reconcile waits for the Volcano (or Cilium policy) lists before it goes on without them.
VOLCANO_SYNC_WAIT_S = 10.0


class Daemon:
    def __init__(self, config_path: str, make_reconciler, resync_interval_s: float = 30.0,
                 metrics_address: str | None = None, netns: str | None = None, pod_watcher_factory=None,
                 pod_resources=None, sm_check_settings=None, config_source=None, volcano_factory=None,
                 cilium_factory=None, web_config_file: str | None = None,
                 metrics_all_tenants: bool = False, startup_taint=None):
        self.path = config_path
        # daemon.taint.StartupTaint (--remove-taint): told after each reconcile that enforced the tenants.
        self.startup_taint = startup_taint
        # discovery.kubernetes.configmap.ConfigMapSource (--config-map): the tenants file through the API.
        self.config_source = config_source
        self.config_changed = False
        # factory(on_change) -> discovery.kubernetes.volcano.VolcanoView, started once a tenant uses Volcano.
        self.volcano_factory = volcano_factory
        self.volcano = None
        # factory(on_change) -> discovery.kubernetes.ciliumpolicies.CiliumPolicyView (--cilium-policies).
        self.cilium_factory = cilium_factory
        self.cilium = None
        self._cilium_since = 0.0
        self._effective: Config | None = None  # the config enforced: after policies and queue weights
        self._volcano_since = 0.0
        self._volcano_unsynced_said = False
        self.make_reconciler = make_reconciler
        self.resync_s = resync_interval_s
        self.log = log.get("shaperd.daemon")
        self.config: Config | None = None
        self.watch = ConfigWatch(config_path)
        self.stop = False
        self.reload_requested = False
        self.failures = 0
        self.reconciles = 0
        # READY=1 waits for the first reconcile that ran (rec.apply returned); until then STATUS= says
        # what it waits for (``waiting_for``).
        self.reconciled_once = False
        self.waiting_for = "reading the node"
        self.degraded = None  # report.degraded.Degraded of the last reconcile that ran
        self._stop_failed: list[str] = []  # components whose stop raised at shutdown
        self.metrics_address = metrics_address or None
        self.web_config_file = web_config_file or None  # report/webconfig.py: TLS and basic auth on /metrics
        # Per-tenant series of every tenant (True), or of those present on the node only (report/presence.py).
        self.metrics_all_tenants = metrics_all_tenants
        self.netns = netns
        self.metrics = None  # report.metrics.Metrics when serving
        self.sampler = None
        self.rdma_sampler = None  # report.rdma_sampler.RdmaSampler when serving metrics
        self.sm_checker = None  # report.rdma_smcheck.SmChecker when serving metrics
        self.jobs: dict = {}  # backend name -> its spec's job (edt's rate controller), started on first use
        self.sm_check_settings = sm_check_settings  # report.rdma_smcheck.SmCheckSettings; None: defaults
        # Drift: a reconcile that changed the kernel although the config it
        # enforces was already applied successfully once.
        self.config_gen = 0
        self.applied_gen: int | None = None
        # Kubernetes discovery: factory(on_change) -> discovery.kubernetes.PodWatcher; None on bare metal.
        self.pod_watcher_factory = pod_watcher_factory
        self.pods = None
        self.pods_changed = False
        # discovery.podresources.source.PodResourcesSource, shared with the reconciler; None when off.
        self.pod_resources = pod_resources
        self._wake_fd: int | None = None
        self._wake_rfd: int | None = None
        self.events = None  # kernel.events.KernelEvents while running
        from shaperd.report.sdnotify import Notifier

        self.notify = Notifier()  # sd_notify to systemd; a no-op outside a Type=notify unit

    # -- signals -------------------------------------------------------
    def _on_term(self, signum, _frame) -> None:
        self.stop = True

    def _on_hup(self, _signum, _frame) -> None:
        self.reload_requested = True

    # -- config --------------------------------------------------------
    def load(self, why: str, force: bool = False) -> bool:
        """Try the file; keep the last good config on failure. True if the config changed."""
        src = self.config_source
        got = None
        if src is None:
            got = self.watch.read(force=force)
            if got.torn:
                self.log.info("config file changed while read; reading again once it settles", file=self.path, reason=why)
                return False
            if not got.new:
                return False
        try:
            if got is None:
                cfg = src.load()
            else:
                if got.error is not None:
                    raise got.error
                cfg = load_text(got.text, self.path)
        except ConfigError as e:
            self.log.error("config rejected", file=src.describe if src else self.path, reason=why,
                           problems=[str(p) for p in e.problems],
                           keeping="last good config" if self.config else "nothing enforced yet")
            if self.metrics:
                self.metrics.config_loaded(False)
            return False
        changed = cfg != self.config
        self.config = cfg
        if changed:
            self.config_gen += 1
        if self.metrics:
            self.metrics.config_loaded(True, cfg)
        self.log.info("config loaded", file=src.describe if src else self.path, reason=why, tenants=len(cfg.tenants),
                      changed=changed)
        return True

    # -- start-up, loop, shutdown ---------------------------------------
    def run(self) -> int:
        """Start every component, loop until SIGTERM/SIGINT, stop them all; 1 if one failed to stop.

        Each component's stop is registered on one ExitStack as it starts, so
        shutdown runs in the reverse order of start-up, stops only what did
        start (a start-up that fails half way, e.g. a metrics port in use,
        still stops the watchers it had started) and goes on past a stop that
        raises (logged with the component's name).
        """
        self._stop_failed = []
        with contextlib.ExitStack() as stack:
            rec = self._start(stack)
            self._loop(rec)
        self.log.info("stopped; enforcement left in place", reconciles=self.reconciles,
                      **({"stop_failed": self._stop_failed} if self._stop_failed else {}))
        return 1 if self._stop_failed else 0

    def _on_exit(self, stack: contextlib.ExitStack, what: str, stop) -> None:
        """Call ``stop()`` at shutdown; if it raises, say so and go on with the rest."""

        def guarded() -> None:
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - one component's stop never keeps the others running
                self._stop_failed.append(what)
                self.log.error("stop failed; stopping the rest", component=what, error=repr(e))

        stack.callback(guarded)

    def _started(self, attr: str, method: str = "stop"):
        """A stop for a component started later, by the loop (Volcano view, edt loop): a no-op if it never was."""

        def stop() -> None:
            c = getattr(self, attr)
            if c is not None:
                getattr(c, method)()

        return stop

    def _start(self, stack: contextlib.ExitStack):
        """Signals, the wake-up pipe, the kernel event socket, the watchers, the reconciler, the metrics
        endpoint and its threads, the first load of the tenants file. Returns the reconciler."""
        from shaperd.kernel.events import KernelEvents

        self._on_exit(stack, "sd_notify socket", self.notify.close)
        for sig, handler in ((signal.SIGTERM, self._on_term), (signal.SIGINT, self._on_term),
                             (signal.SIGHUP, self._on_hup)):
            previous = signal.signal(sig, handler)  # None: not set from Python; given back as the default
            self._on_exit(stack, f"signal handler {sig.name}",
                          lambda s=sig, h=previous: signal.signal(s, signal.SIG_DFL if h is None else h))
        rpipe, wpipe = os.pipe()

        def close_pipe() -> None:
            self._wake_fd = None  # a watcher thread that would not stop must not write to a reused fd number
            os.close(wpipe)
            os.close(rpipe)

        self._on_exit(stack, "wake-up pipe", close_pipe)
        os.set_blocking(wpipe, False)
        previous_fd = signal.set_wakeup_fd(wpipe)
        self._on_exit(stack, "signal wake-up fd", lambda: signal.set_wakeup_fd(previous_fd))
        self._wake_rfd, self._wake_fd = rpipe, wpipe
        self.events = KernelEvents(self.netns)
        self._on_exit(stack, "kernel event socket", lambda: self.events.close())  # _drain may have reopened it
        self._start_sources(stack)
        rec = self.make_reconciler(self._pods_snapshot if self.pods is not None else None)
        self._start_observability(rec, stack)
        self._on_exit(stack, "backend jobs", self._stop_jobs)
        self._on_exit(stack, "STOPPING=1", self.notify.stopping)  # the last registered: the first said
        self.log.info("started", config=self.path, resync_interval_s=self.resync_s,
                      capabilities=list(rec.capabilities.notes),
                      report=rec.capability_report() if hasattr(rec, "capability_report") else None)
        if self.config_source is None:
            self.load("start", force=True)  # a ConfigMap loads when its first list arrives (config_changed)
        self.notify.status(self._status())  # what the first reconcile waits for
        return rec

    def _start_sources(self, stack: contextlib.ExitStack) -> None:
        """What the reconcile reads besides the kernel: pods, the ConfigMap, Cilium policies, Volcano, the kubelet."""
        if self.pod_watcher_factory is not None:
            self.pods = self.pod_watcher_factory(self._on_pods_changed)
            self.pods.start()
            self._on_exit(stack, "pod watcher", self.pods.stop)
            self.log.info("watching pods", node=self.pods.node_name if hasattr(self.pods, "node_name") else None)
        if self.config_source is not None:
            self.config_source.start(self._on_config_changed)
            self._on_exit(stack, "ConfigMap watcher", self.config_source.stop)
        if self.cilium_factory is not None:
            self.cilium = self.cilium_factory(self._on_pods_changed)  # a policy change wakes us like a pod event
            self.cilium.start()
            self._on_exit(stack, "CiliumNetworkPolicy view", self.cilium.stop)
            self._cilium_since = time.monotonic()
        self._on_exit(stack, "Volcano view", self._started("volcano"))  # started by the first reconcile using it
        if self.pod_resources is not None:
            self._on_exit(stack, "pod-resources client", self.pod_resources.close)
        if self.startup_taint is not None:
            self._on_exit(stack, "startup taint", self.startup_taint.stop)

    def _loop(self, rec) -> None:
        """Wait for a trigger (kernel event, pod or ConfigMap change, SIGHUP, file poll, resync), reconcile."""
        rpipe = self._wake_rfd
        due = time.monotonic()  # reconcile now
        next_resync = due + self.resync_s
        next_poll = time.monotonic() + FILE_POLL_S
        while not self.stop:
            if self.metrics:
                self.metrics.tick()
                if self.pods is not None:
                    self.metrics.kubernetes(self.pods.synced, self.pods.last_error)
            now = time.monotonic()
            timeout = max(0.0, min(due if due is not None else next_resync, next_resync, next_poll) - now)
            ready, _, _ = select.select([self.events, rpipe], [], [], timeout)
            if rpipe in ready:
                os.read(rpipe, 4096)
            now = time.monotonic()
            if self.events in ready and self._drain().any:
                soon = now + EVENT_DEBOUNCE_S
                due = soon if due is None else min(due, soon)
            if self.pods_changed:
                self.pods_changed = False
                soon = now + POD_DEBOUNCE_S
                due = soon if due is None else min(due, soon)
            if self.reload_requested:
                self.reload_requested = False
                self.notify.reloading()
                if self.load("SIGHUP", force=True):
                    due = now
                self.notify.reloaded(self._status())
            if self.config_changed:
                self.config_changed = False
                if self.load("configmap changed"):
                    due = now
            if now >= next_poll:
                if self.config_source is None and self.watch.due(now) and self.load("file changed"):
                    due = now
                if self.pod_resources is not None and self.pod_resources.poll():
                    due = now
                next_poll = now + self.watch.poll_interval_s(FILE_POLL_S)
            if now >= next_resync:
                due = now
            if due is not None and now >= due and not self.stop:
                due = self.reconcile(rec)
                # The echo of our own writes is not news; but an overflow here may have dropped someone
                # else's events with it (seen when a burst outlasts the reconcile): read everything again.
                if self._drain().overflow and due is None:
                    due = time.monotonic() + EVENT_DEBOUNCE_S
                next_resync = time.monotonic() + self.resync_s
            self.notify.loop_pass(healthy=self.healthy, status=self._status(), ready=self.reconciled_once)

    @property
    def healthy(self) -> bool:
        """The watchdog's verdict: fewer than WATCHDOG_MAX_FAILURES reconciles failed in a row. Degraded
        (a plan problem, a target left alone) is not a failure: it keeps the watchdog fed."""
        return self.failures < WATCHDOG_MAX_FAILURES

    def _status(self) -> str:
        """One line for systemd's STATUS= (systemctl status): what the first reconcile waits for, then how it went."""
        if not self.reconciled_once:
            if self.config is None:
                src = self.config_source.describe if self.config_source is not None else self.path
                return f"waiting for the first reconcile: no valid tenants file yet ({src}); nothing enforced"
            return f"waiting for the first reconcile: {self.waiting_for}"
        state = "failing" if self.failures else "in sync"
        if self.degraded:
            state = f"{state}; {self.degraded.line()}" if self.failures else self.degraded.line()
        return f"{len(self.config.tenants)} tenants, {self.reconciles} reconciles, {state}"

    def _drain(self):
        """Pending kernel events; a failed event socket is reopened (and counts as "everything changed")."""
        from shaperd.kernel.events import Drained, KernelEvents

        try:
            drained = self.events.drain()
        except KernelError as e:
            self.log.error("kernel event socket failed; reopened, full resync", error=str(e))
            self.events.close()
            self.events = KernelEvents(self.netns)
            return Drained(overflow=True)
        if drained.overflow:
            self.log.warning("kernel events were lost (event socket overflow); full resync")
        return drained

    def _on_pods_changed(self) -> None:
        """Called on the watcher's thread: flag and wake the loop (a pipe write is thread-safe)."""
        self.pods_changed = True
        if self._wake_fd is not None:
            try:
                os.write(self._wake_fd, b"p")
            except OSError:
                pass  # pipe full: the loop is awake anyway

    def _on_config_changed(self) -> None:
        """The ConfigMap watcher's thread: flag and wake the loop, like a pod event."""
        self.config_changed = True
        if self._wake_fd is not None:
            try:
                os.write(self._wake_fd, b"c")
            except OSError:
                pass

    def _pods_snapshot(self):
        pods = list(self.pods.snapshot().values())
        return self.volcano.with_queues(pods) if self.volcano is not None else pods

    def reconcile(self, rec) -> float | None:
        """One reconcile; returns when to retry (None = wait for the next trigger)."""
        if self.config is None:
            return None
        if self.pods is not None:
            if self.metrics:
                self.metrics.kubernetes(self.pods.synced, self.pods.last_error)
            if not self.pods.has_synced:
                # Until the first pod list, an empty snapshot means "unknown", not "no pods":
                # leave the kernel as it is (a restarted agent keeps the previous enforcement).
                self.log.info("waiting for the first pod list before reconciling", error=self.pods.last_error)
                self._waiting("the first pod list from the API server"
                              + (f" ({self.pods.last_error})" if self.pods.last_error else ""))
                return time.monotonic() + 1.0
        cfg = self.config
        if self.cilium is not None:
            if not self.cilium.has_synced and time.monotonic() - self._cilium_since < VOLCANO_SYNC_WAIT_S:
                self.log.info("waiting for the first CiliumNetworkPolicy lists before reconciling")
                self._waiting("the first CiliumNetworkPolicy lists")
                return time.monotonic() + 1.0
            cfg = self.cilium.effective(cfg)  # bounded wait: unlisted policies add nothing
        if self.volcano_factory is not None:
            from shaperd.discovery.kubernetes.volcano import uses_volcano

            if self.volcano is None and uses_volcano(cfg):
                self.volcano = self.volcano_factory(self._on_pods_changed)  # queue/PodGroup changes wake us like pods
                self.volcano.start()
                self._volcano_since = time.monotonic()
            if self.volcano is not None:
                if not self.volcano.has_synced:
                    # A short wait, so a start does not flap pods out of their queues' tenants; bounded, so
                    # a Volcano watch that cannot list (RBAC, API down) never costs the others enforcement.
                    if time.monotonic() - self._volcano_since < VOLCANO_SYNC_WAIT_S:
                        self.log.info("waiting for the first Volcano PodGroup and Queue lists before reconciling")
                        self._waiting("the first Volcano PodGroup and Queue lists")
                        return time.monotonic() + 1.0
                    if not self._volcano_unsynced_said:
                        self._volcano_unsynced_said = True
                        self.log.warning("Volcano PodGroups/Queues not listed yet; reconciling without queues",
                                         waited_s=VOLCANO_SYNC_WAIT_S)
                cfg = self.volcano.effective(cfg)
        if cfg != self._effective:  # what is enforced changed (file, queue weight, policy): a change, not drift
            self._effective = cfg
            self.config_gen += 1
        self.reconciles += 1
        gen = self.config_gen
        start = time.perf_counter()
        self._waiting("reading the node")
        try:
            rep = rec.apply(cfg)
        except ShaperdError as e:
            self.failures += 1
            delay = RETRY_BACKOFF_S[min(self.failures, len(RETRY_BACKOFF_S)) - 1]
            self.log.error("reconcile failed", error=str(e), retry_in_s=delay)
            self._waiting(f"the last attempt failed, retrying in {delay:g} s: {e}")
            if self.metrics:
                from shaperd.report.metrics import exception_kind

                self.metrics.reconciled(time.perf_counter() - start, {exception_kind(e)}, ok=False, drift=False)
            return time.monotonic() + delay
        # Failed: a write refused or a target unreadable (retried with backoff, counted against the watchdog).
        # Degraded: a plan problem or a target left alone; reported, never retried sooner (nothing would change).
        failed = any(d.failed or d.error for d in rep.devices)
        self.reconciled_once = True
        self.degraded = degraded_of(rep)
        drift = rep.changes > 0 and self.applied_gen == gen
        self.log.info("reconciled", changes=rep.changes, devices=len(rep.planned_devices),
                      duration_ms=round(rep.duration_s * 1000, 1), ok=rep.ok, drift_repair=drift)
        self._observe(rep, ok=not failed, drift=drift)
        self._run_jobs(rep, getattr(rec, "capabilities", None))
        if failed:
            self.failures += 1
            if not _worth_retrying(rep):  # EPERM, EINVAL: asking again soon changes nothing; the resync will
                self.log.warning("reconcile failed permanently; not retried before the next trigger or resync")
                return None
            return time.monotonic() + RETRY_BACKOFF_S[min(self.failures, len(RETRY_BACKOFF_S)) - 1]
        self.failures = 0
        self.applied_gen = gen
        if self.startup_taint is not None:  # ran, nothing failed: the tenants are enforced (daemon/taint.py)
            self.startup_taint.enforced()
        return None

    def _waiting(self, what: str) -> None:
        """Before the first reconcile ran: what it waits for, in STATUS= at once (the loop may be busy a while)."""
        if not self.reconciled_once:
            self.waiting_for = what
            self.notify.status(self._status())

    def _stop_jobs(self) -> None:
        """Each backend's job (edt's rate controller), each stopped even when another's stop fails."""
        with contextlib.ExitStack() as stack:
            for name, job in self.jobs.items():
                self._on_exit(stack, f"{name} job", job.stop)

    def _run_jobs(self, rep, caps=None) -> None:
        """Hand each backend's desired state to its background job (its spec's ``job``: edt's rate
        controller loop), started on first use."""
        from shaperd.engine.registry import REGISTRY

        desired = getattr(getattr(rep, "plan", None), "desired", {})
        for spec in REGISTRY.specs:
            if spec.job is None or spec.name not in desired:
                continue
            job = self.jobs.get(spec.name)
            if job is None:
                job = self.jobs[spec.name] = spec.job(self.netns, caps)
            job.update(desired[spec.name])

    # -- observability -------------------------------------------------
    def _start_observability(self, rec, stack: contextlib.ExitStack) -> None:
        """Sampler threads (tc classes, RDMA ports), the SM check and the HTTP endpoint, if a metrics address is
        set; each one's stop on ``stack``."""
        if not self.metrics_address:
            return
        from shaperd.report.http import MetricsServer
        from shaperd.report.metrics import Metrics
        from shaperd.report.sampler import Sampler

        from shaperd.report import rdma_metrics
        from shaperd.report.rdma_sampler import RdmaSampler
        from shaperd.report.rdma_smcheck import SmChecker, SmCheckSettings, kernel_reader

        self.sampler = Sampler(_stats_reader(self.netns))
        self.metrics = Metrics(self.sampler, all_tenants=self.metrics_all_tenants)
        self.rdma_sampler = RdmaSampler(_rdma_reader(rec.roots))
        settings = self.sm_check_settings or SmCheckSettings()
        self.sm_checker = SmChecker(kernel_reader(settings), settings)
        rdma_metrics.install(self.metrics, self.rdma_sampler, self.sm_checker)
        install_backend_metrics(self.metrics, rec.enabled, self.jobs)
        install_annotation_metrics(self.metrics, rec)
        if self.startup_taint is not None:
            self.metrics.collectors.collectors["startup_taint"] = self.startup_taint.collector()
        try:
            server = MetricsServer(self.metrics_address, self.metrics, self.web_config_file)
        except (OSError, ValueError) as e:
            raise ShaperdError(f"listen on metrics address {self.metrics_address}: {getattr(e, 'strerror', None) or e}") from e
        for what, c in (("class-stats sampler", self.sampler), ("RDMA sampler", self.rdma_sampler),
                        ("SM-table check", self.sm_checker), ("metrics endpoint", server)):
            c.start()
            self._on_exit(stack, what, c.stop)
        self.log.info("serving metrics", address=self.metrics_address, paths=["/metrics", "/healthz", "/readyz"],
                      scheme=server.scheme, web_config=self.web_config_file)

    def _observe(self, rep, ok: bool, drift: bool) -> None:
        if not self.metrics:
            return
        from shaperd.report.metrics import report_error_kinds

        eps = rep.endpoints if self.config else None
        self.metrics.reconciled(rep.duration_s, report_error_kinds(rep), ok=ok, drift=drift, endpoints=eps,
                                degraded=self.degraded)
        if self.pods is not None and self.config is not None:
            pods = {t.name: 0 for t in self.config.tenants}
            for tenant in rep.plan.pod_tenants.values():
                pods[tenant] = pods.get(tenant, 0) + 1
            self.metrics.kubernetes(self.pods.synced, self.pods.last_error, pods)
        inv = getattr(rep, "inventory", None)
        if self.config is not None and inv is not None:
            from shaperd.report.presence import present_tenants

            self.metrics.present(present_tenants(self.config, inv, rep.plan.tenancy, pods_known=self.pods is not None))
        if self.sampler is not None:
            self.sampler.set_targets(rep.targets)
        if self.rdma_sampler is not None and self.config is not None:
            self.rdma_sampler.set_targets(rdma_targets(self.config, rep))
        if self.sm_checker is not None and self.config is not None and inv is not None:
            self.sm_checker.set_inputs(self.config, inv, rdma_plan_of(self.config, rep))


def _worth_retrying(rep) -> bool:
    """A failed reconcile is retried with backoff unless every failure is a permanent kernel refusal."""
    if any(d.error for d in rep.devices):
        return True  # a device that could not be read (a timeout, an interrupted dump): transient
    return any(err.transient for d in rep.devices for _op, err in d.failed)


def rdma_plan_of(cfg, rep):
    """The RDMA plan: the backend's, where it made one, else planned here (pure)."""
    from shaperd.rdma.plan import RdmaPlan, plan as rdma_plan

    p = rep.plan.desired.get("rdma")
    return p if isinstance(p, RdmaPlan) else rdma_plan(cfg, rep.inventory, rep.plan.tenancy)


def rdma_targets(cfg, rep) -> dict:
    """The node's RDMA ports and their owners: the RDMA plan's, where a backend made one, else planned here (pure)."""
    from shaperd.rdma.plan import plan as rdma_plan
    from shaperd.report.rdma_sampler import targets_of

    inv = getattr(rep, "inventory", None)
    if inv is None:
        return {}
    owners = getattr(rep.plan.desired.get("rdma"), "owners", None)
    if owners is None:
        owners = rdma_plan(cfg, inv, rep.plan.tenancy).owners
    return targets_of(inv.rdma, owners)


def install_backend_metrics(metrics, running, jobs: dict) -> None:
    """Each running backend's own collector (its spec's ``metrics``): nothing here names a backend.
    ``jobs``: backend name -> its background job, looked up when scraped (started after the first reconcile)."""
    from shaperd.engine.registry import REGISTRY

    by_name = {b.name: b for b in running}
    for spec in REGISTRY.specs:
        if spec.metrics is not None and spec.name in by_name:
            spec.metrics(metrics, by_name[spec.name], lambda name=spec.name: jobs.get(name))


def install_annotation_metrics(metrics, rec) -> None:
    """The reconciler's ledger of refused pod annotations (engine/annotations.py) as its own collector."""
    ledger = getattr(rec, "annotations", None)
    if ledger is not None:
        metrics.collectors.collectors["annotations"] = ledger.collector()


def _rdma_reader(roots):
    """A read function for the RDMA sampler thread: the ports' counters from sysfs."""
    from shaperd.discovery.rdma_counters import read_ports

    return lambda ports: read_ports(roots, ports)


def _stats_reader(netns: str | None):
    """A read function for the sampler thread, on a netlink socket of its own (reopened after a failure)."""
    from shaperd.backends.htb.observe import read_counters
    from shaperd.kernel.rtnl import RtnlReader

    holder: dict = {}

    def read():
        if "r" not in holder:
            holder["r"] = RtnlReader(netns)
        try:
            return read_counters(holder["r"])
        except Exception:
            holder.pop("r").close()
            raise

    return read
