"""The HTTP calls of the generic resource watches: one GET for a list, one for a watch stream.

Owns the only two requests ``ResourceWatcher`` makes (so a port away from the
``kubernetes`` client library replaces this file and nothing else): a list of
a collection path and a watch of it, each with a deadline, and the mapping of
their failures through ``errors.map_api_error``.

Must not: keep state, retry or log (the watcher's).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .errors import KubernetesError, TransientKubernetesError, WatchStreamCorrupt, map_api_error


class NotFound(KubernetesError):
    """404 on a collection: the API group (a CRD such as Volcano's) is not installed, or the path is wrong."""


def api_client(cfg):
    from kubernetes import client

    cfg.retries = False  # our backoff, not urllib3's silent repeats
    cfg.keep_alive = True
    return client.ApiClient(configuration=cfg)


def _get(api, path: str, query: dict[str, str], timeout: tuple[float, float]):
    """One GET through the client library's auth and TLS; the streaming urllib3 response, 2xx only."""
    from kubernetes.client.exceptions import ApiException

    method, url, headers, body, post = api.param_serialize("GET", path, query_params=list(query.items()),
                                                           auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body, post_params=post,
                        _request_timeout=timeout).response  # unread: a watch streams from it
    if not 200 <= resp.status <= 299:
        try:
            resp.release_conn()
        finally:
            raise ApiException(status=resp.status, reason=resp.reason)
    return resp


def _mapped(verb: str, what: str, e: BaseException) -> KubernetesError:
    status = getattr(e, "status", None)
    if status == 404:
        return NotFound(verb, what, "HTTP 404 Not Found (API group not installed?)", 404)
    return map_api_error(verb, what, e)


def list_collection(api, path: str, query: dict[str, str], timeout_s: float) -> dict:
    """GET a collection: the parsed list object (``metadata.resourceVersion``, ``items``)."""
    try:
        resp = _get(api, path, query, (min(10.0, timeout_s), timeout_s))
        try:
            body = resp.data
        finally:
            resp.release_conn()
    except Exception as e:
        raise _mapped("list", path, e) from e
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise TransientKubernetesError("list", path, f"response is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise TransientKubernetesError("list", path, "response is not a list object (no items)")
    return doc


def open_watch(api, path: str, query: dict[str, str], watch_timeout_s: int, timeout_s: float):
    """Start a watch (the caller publishes the response so stop() can cut it) ."""
    q = dict(query, watch="true", allowWatchBookmarks="true", timeoutSeconds=str(watch_timeout_s))
    try:
        return _get(api, path, q, (min(10.0, timeout_s), watch_timeout_s + timeout_s))
    except Exception as e:
        raise _mapped("watch", path, e) from e


def watch_events(resp, path: str) -> Iterator[dict[str, Any]]:
    """The events of an open watch: {type, object} dicts; a line that is not one raises WatchStreamCorrupt."""
    from kubernetes.watch.watch import iter_resp_lines

    try:
        for line in iter_resp_lines(resp):
            if not line or line.isspace():
                continue
            try:
                ev = json.loads(line)
            except ValueError as e:
                raise WatchStreamCorrupt("decode", f"watch event of {path}", f"not JSON: {line[:80]!r}") from e
            if not isinstance(ev, dict) or not isinstance(ev.get("type"), str) or not isinstance(ev.get("object"), dict):
                raise WatchStreamCorrupt("decode", f"watch event of {path}", f"not a {{type, object}}: {line[:80]!r}")
            if ev["type"] == "ERROR":
                code = ev["object"].get("code")
                from kubernetes.client.exceptions import ApiException

                raise _mapped("watch", path, ApiException(status=code, reason=str(ev["object"].get("message", ""))))
            yield ev
    except KubernetesError:
        raise
    except Exception as e:
        raise _mapped("watch", path, e) from e
    finally:
        try:
            resp.release_conn()
        except Exception:  # noqa: BLE001 - a cut socket may refuse
            pass
