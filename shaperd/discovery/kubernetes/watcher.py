"""Follow the pods scheduled on this node: one list-then-watch loop in a background thread.

Owns the loop: a list (field selector ``spec.nodeName=<node>``, all
namespaces), then watches from its resourceVersion with bookmarks, relist
on 410 Gone, reconnect with jittered exponential backoff, and the pod cache
the daemon reads with ``snapshot()``. Every failure becomes a typed
``KubernetesError`` (``errors.map_api_error``, cause chained) and a log
line; nothing escapes the thread.

A watch line that is not a watch event ends the stream and the loop
resumes from the last good resourceVersion (what client-go does on a
decode error), so nothing after it is lost or applied out of order; the
same corruption twice at one version (a poison event in history) relists.

Must not: write to the kernel or to the API server, or decide what a pod
means for shaping. It keeps the cache true and calls ``on_change()`` when
the cache changed; the daemon debounces and reconciles.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from shaperd.core import log
from shaperd.discovery.kubernetes import watchstream
from shaperd.discovery.kubernetes.api import CoreV1
from shaperd.discovery.kubernetes.backoff import Backoff
from shaperd.discovery.kubernetes.client import load_client_config
from shaperd.discovery.kubernetes.transport import ApiClient
from shaperd.discovery.kubernetes.errors import (
    KubernetesError,
    PodParseError,
    ResourceExpired,
    TransientKubernetesError,
    WatchStreamCorrupt,
    map_api_error,
)
from shaperd.discovery.kubernetes.pods import PodInfo, describe_pod, object_resource_version

_log = log.get("shaperd.k8s")

POD_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")
# A watch that delivered no event but stayed open this long was not a failure
# to connect: the next failure starts the backoff from the beginning.
PROGRESS_AFTER_S = 5.0
# A watch that ended cleanly, without events, sooner than this is treated like a
# failure (backed off): a server closing watches at once must not be hammered.
QUICK_CLOSE_S = 1.0


def _cut(resp) -> None:
    """Shut the socket under a streaming response, so a read blocked on it returns now."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class PodWatcher:
    """List-then-watch of this node's pods in a background thread, served as a snapshot."""

    def __init__(
        self,
        node_name: str,
        on_change: Callable[[], None],
        kubeconfig: str | None = None,
        request_timeout_s: float = 30.0,
        watch_timeout_s: int = 300,
        backoff: Backoff = Backoff(),
        client_configuration: Any = None,
        *,
        rng: random.Random | None = None,
        wait: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``request_timeout_s``: connect and read timeout of a list, and the grace
        beyond ``watch_timeout_s`` before a silent watch is given up (bounded waits,
        so a hung server is noticed). ``watch_timeout_s``: the server closes each
        watch after this long (timeoutSeconds) and we resume from the last version;
        5 min like client-go's lower bound. ``client_configuration`` (a
        ``kubeconfig.ClientConfig``) overrides kubeconfig loading (tests, embedding).

        Time is injectable, so tests assert the schedule the loop asks for
        instead of measuring it: ``rng`` is the backoff jitter's random source;
        ``wait(delay_s)`` is how the loop waits between attempts (default: on
        the stop event, so ``stop()`` cuts the wait short; an injected one must
        return by itself); ``clock`` (monotonic seconds) judges how long a
        watch lived (``PROGRESS_AFTER_S``, ``QUICK_CLOSE_S``)."""
        if not node_name:
            raise ValueError("node_name is required (the downward API's spec.nodeName)")
        self.node_name = node_name
        self.field_selector = f"spec.nodeName={node_name}"
        self._on_change = on_change
        self._kubeconfig = kubeconfig
        self._cfg = client_configuration
        self.request_timeout_s = float(request_timeout_s)
        self.watch_timeout_s = int(watch_timeout_s)
        self.backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock

        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._rv: str | None = None
        self._synced = False
        self._has_synced = False
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._resp = None  # the open watch response, cut by stop()
        self._api = None
        self._progress = False  # the last watch delivered events or lived >= PROGRESS_AFTER_S before it failed

    # ---- public surface

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("PodWatcher already started")
        if self._cfg is None:
            self._cfg = load_client_config(self._kubeconfig)  # KubernetesConfigError is the caller's to report
        # No urllib3 retries (our backoff, our synced flag), TCP keepalive: transport.ApiClient.
        self._api = CoreV1(ApiClient(self._cfg))
        self._thread = threading.Thread(target=self._run, name=f"shaperd-k8s-pods-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ends the loop. A watch in progress is cut at the socket; a request still
        waiting for a hung server is abandoned (daemon thread, it ends at its timeout
        and changes nothing after stop)."""
        self._stop.set()
        with self._lock:
            resp = self._resp  # see _watch_once.call: set under the lock, so one of us cuts it
        if resp is not None:
            _cut(resp)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                _log.warning("k8s_watch_stop_pending", node=self.node_name,
                             detail="a request to a hung API server is still open; abandoned")
        with self._lock:
            self._synced = False

    def snapshot(self) -> dict[str, PodInfo]:
        with self._lock:
            return dict(self._pods)

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def has_synced(self) -> bool:
        """True once a list has succeeded, and forever after (client-go's HasSynced).
        Before that the empty snapshot means "unknown", not "no pods"."""
        return self._has_synced

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def resource_version(self) -> str | None:
        """The version the cache is at: set together with the cache change, before ``on_change()``."""
        return self._rv

    # ---- loop

    def _run(self) -> None:
        attempt = 0
        expired_in_a_row = 0
        need_list = True
        consistent = False  # after a 410, relist from the primary store, not the cache
        corrupt_at: str | None = None  # the version we last resumed from after a corrupt line
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list(consistent)
                    need_list, consistent = False, False
                    if expired_in_a_row < 2:
                        # A list that works ends an outage. Not in a 410 loop, though (every
                        # watch after a good list expires at once): there the delays keep climbing.
                        attempt = 0
                if self._watch_once():
                    attempt = expired_in_a_row = 0
                    continue
                # closed at once with nothing in it: not an error, but a tight
                # reconnect loop would hammer the server, so back off anyway
            except ResourceExpired as e:
                self._fail(e, level="info")
                need_list, consistent = True, True
                expired_in_a_row += 1
                if expired_in_a_row == 1:
                    continue  # relist at once: the server is up, our version is just old
            except WatchStreamCorrupt as e:
                self._fail(e)
                if corrupt_at == self._rv:
                    # resuming replayed the same corruption: a poison event in
                    # history. Relisting moves past it instead of looping.
                    need_list, consistent, corrupt_at = True, True, None
                else:
                    corrupt_at = self._rv
            except KubernetesError as e:
                self._fail(e)
            except Exception as e:  # never let the thread die
                self._fail(map_api_error("watch", "pods", e), exc_info=True)
            if self._stop.is_set():
                break
            if self._progress:
                attempt = 0  # the connection worked for a while: a new failure starts small
            delay = self.backoff.delay_s(attempt, self._rng)
            attempt += 1
            _log.info("k8s_retry", node=self.node_name, in_s=round(delay, 2), attempt=attempt)
            self._wait(delay)

    def _fail(self, err: KubernetesError, level: str = "warning", exc_info: bool = False) -> None:
        if self._stop.is_set():
            return
        with self._lock:
            self._synced = False
            self._last_error = str(err)
        getattr(_log, level)("k8s_pods_unsynced", node=self.node_name, error=str(err),
                             kind=type(err).__name__, resource_version=self._rv, cached_pods=len(self._pods),
                             exc_info=exc_info)

    def _list(self, consistent: bool) -> None:
        self._progress = False
        kw: dict[str, Any] = {}
        if not consistent:
            # "0": served from the API server's watch cache, which indexes pods by
            # node; N nodes relisting after an outage then do not each scan etcd.
            kw["resource_version"] = "0"
        try:
            resp = self._api.list_pod_for_all_namespaces(
                field_selector=self.field_selector,
                timeout=(min(10.0, self.request_timeout_s), self.request_timeout_s), **kw)
            try:
                body = resp.read()
            finally:
                resp.release_conn()
        except Exception as e:
            raise map_api_error("list", f"pods on node {self.node_name}", e) from e
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise TransientKubernetesError("list", f"pods on node {self.node_name}", f"response is not JSON: {e}") from e
        rv = object_resource_version(doc)
        items = doc.get("items") if isinstance(doc, dict) else None
        if rv is None or not isinstance(items, list):
            raise TransientKubernetesError("list", f"pods on node {self.node_name}",
                                           "response is not a PodList (no metadata.resourceVersion or items)")
        pods: dict[str, PodInfo] = {}
        for item in items:
            try:
                p = PodInfo.from_dict(item)
            except PodParseError as e:
                _log.warning("k8s_pod_skipped", node=self.node_name, pod=e.pod, error=str(e))
                continue
            pods[p.uid] = p
        if self._stop.is_set():
            return
        with self._lock:
            changed = pods != self._pods
            self._pods = pods  # wholesale: pods deleted while we were away are gone
            self._rv = rv
            self._synced = self._has_synced = True
            self._last_error = None
        _log.info("k8s_pods_listed", node=self.node_name, pods=len(pods), resource_version=rv)
        if changed:
            self._notify()

    def _watch_once(self) -> bool:
        """One watch connection. False when it ended at once without a single event."""
        started, events = self._clock(), 0
        self._progress = False
        resp, clean = None, False
        try:
            resp = self._api.list_pod_for_all_namespaces(
                field_selector=self.field_selector, resource_version=self._rv, watch=True,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                timeout=(min(10.0, self.request_timeout_s), self.watch_timeout_s + self.request_timeout_s))
            # Publishing the response under the lock that stop() reads it under
            # means either stop() sees it (and cuts it) or we see the stop.
            with self._lock:
                self._resp = resp
                stopping = self._stop.is_set()
                # Headers of a 2xx arrived: the server answers again. (Non-2xx raised above.)
                if not stopping:
                    if not self._synced:
                        _log.info("k8s_pods_resynced", node=self.node_name, resource_version=self._rv)
                    self._synced = True
                    self._last_error = None
            if stopping:
                _cut(resp)
            for event in watchstream.events(resp, f"pods on node {self.node_name}"):
                if self._stop.is_set():
                    break
                events += 1
                self._apply(event)
            else:
                clean = True
        except Exception as e:
            self._progress = events > 0 or self._clock() - started >= PROGRESS_AFTER_S
            raise map_api_error("watch", f"pods on node {self.node_name} from version {self._rv}", e) from e
        finally:
            with self._lock:
                self._resp = None
            if resp is not None:
                watchstream.close(resp, clean)
        return events > 0 or self._stop.is_set() or self._clock() - started >= QUICK_CLOSE_S

    def _apply(self, event: dict) -> None:
        etype, obj = event["type"], event["object"]
        rv = object_resource_version(obj)
        if etype == "BOOKMARK":
            if rv is not None:
                self._rv = rv
            return
        if etype not in POD_EVENT_TYPES:
            _log.warning("k8s_event_skipped", node=self.node_name, type=etype, resource_version=rv)
            return
        if rv is None:
            _log.warning("k8s_pod_skipped", node=self.node_name, type=etype, pod=describe_pod(obj),
                         error="metadata.resourceVersion missing")
            return
        try:
            pod: PodInfo | None = PodInfo.from_dict(obj)
            uid = pod.uid
        except PodParseError as e:
            _log.warning("k8s_pod_skipped", node=self.node_name, type=etype, pod=e.pod, error=str(e))
            pod = None
            uid = (obj.get("metadata") or {}).get("uid") if etype == "DELETED" else None
        with self._lock:
            self._rv = rv
            before = self._pods.get(uid) if isinstance(uid, str) else None
            if etype == "DELETED":
                if before is None:
                    return
                del self._pods[uid]
            elif pod is None:
                return  # keep the last good version of a pod that became unreadable
            elif pod.node and pod.node != self.node_name:
                if before is None:
                    return
                del self._pods[uid]  # moved off the selector (does not happen to pods today)
            elif before == pod:
                return  # status churn shaperd does not care about
            else:
                self._pods[uid] = pod
        _log.debug("k8s_pod_event", node=self.node_name, type=etype, pod=f"{(pod or before).key}", resource_version=rv)
        self._notify()

    def _notify(self) -> None:
        if self._stop.is_set():
            return
        try:
            self._on_change()
        except Exception:
            _log.error("k8s_on_change_failed", node=self.node_name, exc_info=True)
