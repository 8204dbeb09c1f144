"""A generic list-then-watch of one collection path, in a background thread, served as a snapshot.

Owns the loop for every watch that is not the pod watch (the tenants
ConfigMap, Volcano PodGroups and Queues): list, then watch from the list's
resourceVersion (bookmarks), relist on 410 Gone and after a corrupt line,
jittered backoff on failures (``Backoff``), and the cache of raw objects by
``namespace/name``. A 404 on the list (the API group is not installed, e.g.
no Volcano) is said once, the cache is empty and "synced" (it is the truth),
and the list is retried every ``absent_retry_s`` in case it gets installed.
The requests themselves are in ``api.py``.

Must not: interpret the objects (its callers do), write anything, or let an
exception escape the thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from shaperd.core import log
from shaperd.discovery.kubernetes import api as k8s_api
from shaperd.discovery.kubernetes.backoff import Backoff
from shaperd.discovery.kubernetes.client import load_client_config
from shaperd.discovery.kubernetes.errors import KubernetesError, ResourceExpired, WatchStreamCorrupt, map_api_error
from shaperd.discovery.kubernetes.pods import object_resource_version
from shaperd.discovery.kubernetes.watcher import _cut

_log = log.get("shaperd.k8s")


def object_key(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if isinstance(ns, str) and ns else meta["name"]


class ResourceWatcher:
    """List-then-watch of ``path`` (e.g. /apis/scheduling.volcano.sh/v1beta1/podgroups)."""

    def __init__(self, path: str, on_change: Callable[[], None], *, what: str | None = None,
                 field_selector: str | None = None, kubeconfig: str | None = None, client_configuration: Any = None,
                 request_timeout_s: float = 30.0, watch_timeout_s: int = 300, backoff: Backoff = Backoff(),
                 absent_retry_s: float = 60.0, rng: random.Random | None = None,
                 wait: Callable[[float], object] | None = None):
        self.path = path
        self.what = what or path
        self._query = {"fieldSelector": field_selector} if field_selector else {}
        self._on_change = on_change
        self._kubeconfig = kubeconfig
        self._cfg = client_configuration
        self.request_timeout_s = float(request_timeout_s)
        self.watch_timeout_s = int(watch_timeout_s)
        self.backoff = backoff
        self.absent_retry_s = absent_retry_s
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._objects: dict[str, dict] = {}
        self._rv: str | None = None
        self._stop = threading.Event()
        self._wait = wait if wait is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._resp = None
        self._api = None
        self.synced = False
        self.has_synced = False
        self.absent = False  # the last list was a 404
        self._absent_said = False
        self.last_error: str | None = None

    def start(self) -> None:
        if self._cfg is None:
            self._cfg = load_client_config(self._kubeconfig)
        self._api = k8s_api.api_client(self._cfg)
        self._thread = threading.Thread(target=self._run, name=f"shaperd-k8s-{self.what}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            _cut(resp)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._objects)

    # ---- loop

    def _run(self) -> None:
        attempt = 0
        need_list = True
        while not self._stop.is_set():
            delay = None
            try:
                if need_list:
                    self._list()
                    need_list, attempt = False, 0
                    if self.absent:
                        self._wait(self.absent_retry_s)
                        need_list = True
                        continue
                if self._watch_once():
                    attempt = 0
                    continue
            except ResourceExpired as e:
                self._fail(e, "info")
                need_list = True
                if attempt == 0:
                    attempt = 1
                    continue  # relist at once
            except WatchStreamCorrupt as e:
                self._fail(e)
                need_list = True
            except KubernetesError as e:
                self._fail(e)
            except Exception as e:  # noqa: BLE001 - never let the thread die
                self._fail(map_api_error("watch", self.what, e))
            if self._stop.is_set():
                break
            delay = self.backoff.delay_s(attempt, self._rng)
            attempt += 1
            self._wait(delay)

    def _fail(self, err: KubernetesError, level: str = "warning") -> None:
        if self._stop.is_set():
            return
        self.synced = False
        self.last_error = str(err)
        getattr(_log, level)("k8s_resource_unsynced", resource=self.what, error=str(err), kind=type(err).__name__,
                             resource_version=self._rv, cached=len(self._objects))

    def _list(self) -> None:
        try:
            doc = k8s_api.list_collection(self._api, self.path, self._query, self.request_timeout_s)
        except k8s_api.NotFound as e:
            if not self._absent_said:
                _log.warning("k8s_resource_absent", resource=self.what, error=str(e),
                             detail="not installed on this cluster; working without it "
                                    f"(looked for again every {self.absent_retry_s:.0f} s)")
                self._absent_said = True
            self._replace({}, None)
            self.absent = True
            return
        objs = {k: o for o in doc["items"] if (k := object_key(o)) is not None}
        if self.absent:
            _log.info("k8s_resource_present", resource=self.what, objects=len(objs))
        self.absent = False
        self._absent_said = False
        self._replace(objs, object_resource_version(doc))

    def _replace(self, objs: dict[str, dict], rv: str | None) -> None:
        with self._lock:
            changed = objs != self._objects or not self.has_synced
            self._objects, self._rv = objs, rv
            self.synced = self.has_synced = True
            self.last_error = None
        if changed:
            self._notify()

    def _watch_once(self) -> bool:
        q = dict(self._query)
        if self._rv:
            q["resourceVersion"] = self._rv
        resp = k8s_api.open_watch(self._api, self.path, q, self.watch_timeout_s, self.request_timeout_s)
        with self._lock:
            self._resp = resp
        if self._stop.is_set():
            _cut(resp)
        events, started = 0, time.monotonic()
        try:
            for ev in k8s_api.watch_events(resp, self.path):
                if self._stop.is_set():
                    break
                events += 1
                self._apply(ev)
        finally:
            with self._lock:
                self._resp = None
        # a watch that lived (a quiet collection until timeoutSeconds) is not a failure to back off from
        return events > 0 or self._stop.is_set() or time.monotonic() - started >= 1.0

    def _apply(self, ev: dict) -> None:
        etype, obj = ev["type"], ev["object"]
        rv = object_resource_version(obj)
        if etype == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        key = object_key(obj)
        if key is None or etype not in ("ADDED", "MODIFIED", "DELETED"):
            return
        with self._lock:
            if rv:
                self._rv = rv
            if etype == "DELETED":
                if self._objects.pop(key, None) is None:
                    return
            elif self._objects.get(key) == obj:
                return
            else:
                self._objects[key] = obj
        self._notify()

    def _notify(self) -> None:
        if self._stop.is_set():
            return
        try:
            self._on_change()
        except Exception:  # noqa: BLE001
            _log.error("k8s_on_change_failed", resource=self.what, exc_info=True)
