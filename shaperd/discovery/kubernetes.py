"""Follow the pods scheduled on this node through the Kubernetes API.

Owns the API boundary: loading client credentials, one list-then-watch loop
(field selector ``spec.nodeName=<node>``, all namespaces) with
resourceVersion bookkeeping, relist on 410 Gone, reconnect with jittered
exponential backoff, and a pod cache the daemon reads with ``snapshot()``.
Every failure at this boundary becomes a typed ``KubernetesError`` (cause
chained) and a log line; the loop never lets one escape its thread.

What it must not do: it never writes to the kernel, never writes to the
API server, and never decides what a pod means for shaping. It only keeps
the cache true and calls ``on_change()`` when the cache changed; the daemon
debounces and reconciles.

Decoding is ours, not the client library's: the generated models are strict
(pydantic), so one odd pod would abort a whole list or watch stream. We read
the wire JSON and parse each pod on its own, so a malformed pod is skipped
by name and the others still apply. A line that is not a watch event at all
ends the stream and we resume from the last good resourceVersion (what
client-go does on a decode error): nothing after it is lost or applied out
of order.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import log
from ..errors import ShaperdError

_log = log.get("shaperd.k8s")

POD_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


# --------------------------------------------------------------------------- errors


class KubernetesError(ShaperdError):
    """A request to the API server failed or returned something unusable: 'verb object: cause'."""

    def __init__(self, verb: str, obj: str, cause: str, status: int | None = None):
        self.verb, self.obj, self.cause, self.status = verb, obj, cause, status
        super().__init__(f"{verb} {obj}: {cause}")


class KubernetesConfigError(KubernetesError):
    """No usable credentials (no service account, no kubeconfig). Permanent until the environment changes."""


class TransientKubernetesError(KubernetesError):
    """Connection refused/reset, timeout, 5xx, 429: retried with backoff, cache kept."""


class ResourceExpired(KubernetesError):
    """410 Gone: our resourceVersion is older than the server's history. Relist."""


class WatchStreamCorrupt(TransientKubernetesError):
    """A watch line that is not a watch event (not JSON, no type, no object). Resume from the last good version."""


class PodParseError(KubernetesError):
    """One pod object is missing a field or has a wrong type; that pod is skipped, others are not."""

    def __init__(self, pod: str, path: str, expected: str, got: Any):
        self.pod, self.path = pod, path
        super().__init__("parse", f"pod {pod}", f"{path}: expected {expected}, got {got!r:.80}")


def map_api_error(verb: str, obj: str, exc: BaseException) -> KubernetesError:
    """The one place an exception from the client library becomes one of ours."""
    from kubernetes.client.exceptions import ApiException
    import urllib3.exceptions

    if isinstance(exc, KubernetesError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status if isinstance(exc.status, int) else None
        cause = f"HTTP {exc.status} {exc.reason or ''}".strip()
        if status == 410:
            return ResourceExpired(verb, obj, cause, status)
        if status in (401, 403):
            # Not transient in kopf's sense, but a token rotation or RBAC fix
            # heals it without a restart, so it is still retried (slowly).
            return KubernetesError(verb, obj, f"{cause} (check the service account's RBAC for pods list/watch)", status)
        return TransientKubernetesError(verb, obj, cause, status)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, ValueError)):
        return TransientKubernetesError(verb, obj, f"{type(exc).__name__}: {exc}")
    return KubernetesError(verb, obj, f"unexpected {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- client config


def load_client_config(kubeconfig: str | None = None):
    """A ``kubernetes.client.Configuration`` for this process; never touches the library's global default.

    An explicit ``kubeconfig`` wins (an operator asked for it); otherwise the
    in-cluster service account when running in a pod (KUBERNETES_SERVICE_HOST
    set); otherwise $KUBECONFIG, then ~/.kube/config.
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as e:
            raise KubernetesConfigError("load", "in-cluster service account config", str(e)) from e
        return cfg
    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [os.path.expanduser(p) for p in source.split(os.pathsep) if p]
    if not any(os.path.isfile(p) for p in paths):
        raise KubernetesConfigError(
            "load", f"kubeconfig {source}",
            "no such file, and not in a pod (KUBERNETES_SERVICE_HOST unset); "
            "pass --kubeconfig or set KUBECONFIG",
        )
    try:
        config.load_kube_config(config_file=os.pathsep.join(paths), client_configuration=cfg, persist_config=False)
    except Exception as e:  # ConfigException, yaml errors, bad base64 in certs ...
        raise KubernetesConfigError("load", f"kubeconfig {source}", f"{type(e).__name__}: {e}") from e
    return cfg


# --------------------------------------------------------------------------- PodInfo


class FrozenMap(Mapping[str, str]):
    """An immutable, hashable str->str mapping (pod labels)."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[str, str] | None = None):
        self._d = dict(items or {})
        self._h: int | None = None

    def __getitem__(self, k: str) -> str:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(frozenset(self._d.items()))
        return self._h

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"


@dataclass(frozen=True)
class PodInfo:
    """What shaperd needs to know about one pod; equality decides whether a MODIFIED event matters."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    ips: tuple[str, ...]  # status.podIPs (dual-stack), else status.podIP; () until assigned
    host_network: bool  # spec.hostNetwork: such a pod shares the node's addresses
    qos_class: str | None  # status.qosClass: part of the pod cgroup path
    phase: str  # status.phase; "Unknown" when the server sent none
    node: str  # spec.nodeName

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_dict(cls, obj: Any) -> "PodInfo":
        """Parse a pod as it is on the wire (camelCase JSON). Raises PodParseError naming the pod and field."""
        who = describe_pod(obj)

        def fail(path: str, expected: str, got: Any) -> PodParseError:
            return PodParseError(who, path, expected, got)

        if not isinstance(obj, dict):
            raise fail("", "an object", obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise fail("metadata", "an object", meta)
        spec = _opt_dict(obj, "spec", fail)
        status = _opt_dict(obj, "status", fail)

        uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        for path, v in (("metadata.uid", uid), ("metadata.namespace", ns), ("metadata.name", name)):
            if not isinstance(v, str) or not v:
                raise fail(path, "a non-empty string", v)

        labels = meta.get("labels") or {}
        if not isinstance(labels, dict):
            raise fail("metadata.labels", "an object of strings", labels)
        for k, v in labels.items():
            if not isinstance(v, str):
                raise fail(f"metadata.labels.{k}", "a string", v)

        host_network = spec.get("hostNetwork", False)
        if host_network is None:
            host_network = False
        if not isinstance(host_network, bool):
            raise fail("spec.hostNetwork", "a boolean", host_network)
        node = spec.get("nodeName") or ""
        if not isinstance(node, str):
            raise fail("spec.nodeName", "a string", node)

        ips: list[str] = []
        pod_ips = status.get("podIPs")
        if pod_ips is not None:
            if not isinstance(pod_ips, list):
                raise fail("status.podIPs", "a list", pod_ips)
            for i, entry in enumerate(pod_ips):
                ip = entry.get("ip") if isinstance(entry, dict) else None
                ips.append(_ip(ip, f"status.podIPs[{i}].ip", fail))
        if not ips and status.get("podIP"):
            ips.append(_ip(status.get("podIP"), "status.podIP", fail))

        qos = status.get("qosClass")
        if qos is not None and not isinstance(qos, str):
            raise fail("status.qosClass", "a string", qos)
        phase = status.get("phase") or "Unknown"
        if not isinstance(phase, str):
            raise fail("status.phase", "a string", phase)

        return cls(
            uid=uid, namespace=ns, name=name, labels=FrozenMap(labels), ips=tuple(ips),
            host_network=host_network, qos_class=qos or None, phase=phase, node=node,
        )

    @classmethod
    def from_api(cls, obj: Any) -> "PodInfo":
        """Parse a wire dict or a client-library model (``V1Pod``), via its wire-format serialisation."""
        if isinstance(obj, dict):
            return cls.from_dict(obj)
        from kubernetes.client import ApiClient

        return cls.from_dict(ApiClient().sanitize_for_serialization(obj))


def _opt_dict(obj: dict, key: str, fail) -> dict:
    v = obj.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise fail(key, "an object", v)
    return v


def _ip(v: Any, path: str, fail) -> str:
    if not isinstance(v, str):
        raise fail(path, "an IP address string", v)
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise fail(path, "an IP address", v) from None


def describe_pod(obj: Any) -> str:
    """'namespace/name (uid)' from whatever part of a pod object is readable, for log lines."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return "<no metadata>"
    ns, name, uid = (meta.get(k) for k in ("namespace", "name", "uid"))
    return f"{ns if isinstance(ns, str) else '?'}/{name if isinstance(name, str) else '?'} ({uid if isinstance(uid, str) else '?'})"


def _object_rv(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None


# --------------------------------------------------------------------------- backoff


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between failed attempts.

    initial_s 0.5: a dropped connection usually heals at once (API server
    rolling update, load balancer). max_s 30: every node of a large cluster
    retries, and a 30 s ceiling keeps that load flat during an outage while
    still noticing the server's return within half a minute. jitter 0.5:
    each delay is drawn from [d/2, d] so thousands of nodes do not retry in
    lockstep.
    """

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        d = min(self.max_s, self.initial_s * self.factor ** max(0, attempt))
        return d * (1.0 - self.jitter * rng.random())


# --------------------------------------------------------------------------- watcher


def _watch_class():
    from kubernetes import watch

    class RawWatch(watch.Watch):
        """The library's Watch (request, chunked line splitting, socket-level stop,
        ERROR-event -> ApiException) with our own decoding: events keep the wire dict,
        and a line that is not an event raises instead of being yielded as ``None``."""

        def unmarshal_event(self, data, return_type):
            if not data or data.isspace():
                return None
            try:
                js = json.loads(data)
            except ValueError as e:
                raise WatchStreamCorrupt("decode", "watch event", f"not JSON ({e}): {data[:80]!r}") from e
            if not isinstance(js, dict) or not isinstance(js.get("type"), str) or "object" not in js:
                raise WatchStreamCorrupt("decode", "watch event", f"not a {{type, object}} event: {data[:80]!r}")
            if js["type"] == "ERROR":
                # the library indexes obj['code'], ['reason'], ['message'] unguarded
                if not isinstance(js["object"], dict) or not isinstance(js["object"].get("code"), int):
                    raise WatchStreamCorrupt("decode", "watch ERROR event", f"no Status code: {data[:80]!r}")
                js["object"].setdefault("reason", "")
                js["object"].setdefault("message", "")
            # an event whose object is not a readable pod is the consumer's to skip, by name
            js["raw_object"] = js["object"]
            return js

    return RawWatch


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
    ):
        """``request_timeout_s``: connect and read timeout of a list, and the grace
        beyond ``watch_timeout_s`` before a silent watch is given up (bounded waits,
        so a hung server is noticed). ``watch_timeout_s``: the server closes each
        watch after this long (timeoutSeconds) and we resume from the last version;
        5 min like client-go's lower bound. ``client_configuration`` overrides
        kubeconfig loading (tests, embedding)."""
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
        self._rng = random.Random()

        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._rv: str | None = None
        self._synced = False
        self._has_synced = False
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch = None
        self._api = None
        self._progress = False  # the last watch delivered events or lived >= 5 s before it failed

    # ---- public surface

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("PodWatcher already started")
        if self._cfg is None:
            self._cfg = load_client_config(self._kubeconfig)  # KubernetesConfigError is the caller's to report
        from kubernetes import client

        # We own retries (our backoff, our synced flag): urllib3 must not silently
        # repeat a hung read. TCP keepalive finds a dead peer under a quiet watch.
        self._cfg.retries = False
        self._cfg.keep_alive = True
        self._api = client.CoreV1Api(client.ApiClient(configuration=self._cfg))
        self._thread = threading.Thread(target=self._run, name=f"shaperd-k8s-pods-{self.node_name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ends the loop. A watch in progress is cut at the socket; a request still
        waiting for a hung server is abandoned (daemon thread, it ends at its timeout
        and changes nothing after stop)."""
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
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
                    need_list, consistent, attempt = False, False, 0
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
            self._stop.wait(delay)

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
                field_selector=self.field_selector, _preload_content=False,
                _request_timeout=(min(10.0, self.request_timeout_s), self.request_timeout_s), **kw)
            try:
                body = resp.data
            finally:
                resp.release_conn()
        except Exception as e:
            raise map_api_error("list", f"pods on node {self.node_name}", e) from e
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise TransientKubernetesError("list", f"pods on node {self.node_name}", f"response is not JSON: {e}") from e
        rv = _object_rv(doc)
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
        w = _watch_class()()
        started, events = time.monotonic(), 0
        self._progress = False
        self._watch = w
        api = self._api

        def call(**kw):
            resp = api.list_pod_for_all_namespaces(**kw)
            # Headers of a 2xx arrived: the server answers again. (Non-2xx raised above.)
            if not self._stop.is_set():
                with self._lock:
                    if not self._synced:
                        _log.info("k8s_pods_resynced", node=self.node_name, resource_version=self._rv)
                    self._synced = True
                    self._last_error = None
            return resp

        try:
            for event in w.stream(
                call,
                field_selector=self.field_selector,
                resource_version=self._rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                _request_timeout=(min(10.0, self.request_timeout_s), self.watch_timeout_s + self.request_timeout_s),
            ):
                if self._stop.is_set():
                    break
                if event is not None:
                    events += 1
                    self._apply(event)
        except Exception as e:
            self._progress = events > 0 or time.monotonic() - started >= 5.0
            raise map_api_error("watch", f"pods on node {self.node_name} from version {self._rv}", e) from e
        finally:
            self._watch = None
        return events > 0 or self._stop.is_set() or time.monotonic() - started >= 1.0

    def _apply(self, event: dict) -> None:
        etype, obj = event["type"], event["raw_object"]
        rv = _object_rv(obj)
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
