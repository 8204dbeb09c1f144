"""The HTTP calls of the watches: one GET for a list, one for a watch stream, per collection.

Owns the only requests the agent makes (all GETs, the RBAC is list/watch):
``list_collection``/``open_watch``/``watch_events`` for the generic
``ResourceWatcher``, and ``CoreV1.list_pod_for_all_namespaces`` for the pod
watch (list, or watch=True), each with a deadline, and the mapping of their
failures through ``errors.map_api_error``. The HTTP itself is ``transport``'s,
the line protocol ``watchstream``'s.

Must not: keep state, retry or log (the watchers').
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shaperd.discovery.kubernetes import watchstream
from shaperd.discovery.kubernetes.errors import KubernetesError, TransientKubernetesError, WatchStreamCorrupt, map_api_error
from shaperd.discovery.kubernetes.kubeconfig import ClientConfig
from shaperd.discovery.kubernetes.transport import ApiClient


class NotFound(KubernetesError):
    """404 on a collection: the API group (a CRD such as Volcano's) is not installed, or the path is wrong."""


def api_client(cfg: ClientConfig) -> ApiClient:
    return ApiClient(cfg)


def _mapped(verb: str, what: str, e: BaseException) -> KubernetesError:
    status = getattr(e, "status", None)
    if status == 404:
        return NotFound(verb, what, "HTTP 404 Not Found (API group not installed?)", 404)
    return map_api_error(verb, what, e)


def list_collection(api: ApiClient, path: str, query: dict[str, str], timeout_s: float) -> dict:
    """GET a collection: the parsed list object (``metadata.resourceVersion``, ``items``)."""
    try:
        doc = api.get_json(path, query, (min(10.0, timeout_s), timeout_s))
    except ValueError as e:
        raise TransientKubernetesError("list", path, f"response is not JSON: {e}") from e
    except Exception as e:
        raise _mapped("list", path, e) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise TransientKubernetesError("list", path, "response is not a list object (no items)")
    return doc


def open_watch(api: ApiClient, path: str, query: dict[str, str], watch_timeout_s: int, timeout_s: float):
    """Start a watch (the caller publishes the response so stop() can cut it)."""
    q = dict(query, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(watch_timeout_s))
    try:
        return api.get(path, q, (min(10.0, timeout_s), watch_timeout_s + timeout_s))
    except Exception as e:
        raise _mapped("watch", path, e) from e


def watch_events(resp, path: str) -> Iterator[dict[str, Any]]:
    """The events of an open watch: {type, object} dicts; a line that is not one raises WatchStreamCorrupt."""
    clean = False
    try:
        for ev in watchstream.events(resp, path):
            if not isinstance(ev["object"], dict):
                raise WatchStreamCorrupt("decode", f"watch event of {path}", f"object is not a mapping: {ev['object']!r:.80}")
            yield ev
        clean = True
    except KubernetesError:
        raise
    except Exception as e:
        raise _mapped("watch", path, e) from e
    finally:
        watchstream.close(resp, clean)


class CoreV1:
    """The pod watch's one call, named as client-go/the kubernetes client name it (``list``, or ``watch=True``)."""

    PODS = "/api/v1/pods"

    def __init__(self, api: ApiClient):
        self.api = api

    def list_pod_for_all_namespaces(self, *, field_selector: str, timeout: tuple[float, float],
                                    resource_version: str | None = None, watch: bool = False,
                                    allow_watch_bookmarks: bool = False, timeout_seconds: int | None = None):
        """The streaming response (unread, 2xx only: ``ApiStatus`` otherwise) of a list or a watch of pods."""
        q = {"fieldSelector": field_selector}
        if resource_version is not None:
            q["resourceVersion"] = resource_version
        if watch:
            q["watch"] = "true"
            if allow_watch_bookmarks:
                q["allowWatchBookmarks"] = "true"
            if timeout_seconds is not None:
                q["timeoutSeconds"] = str(timeout_seconds)
        return self.api.get(self.PODS, q, timeout)
