"""The Kubernetes API boundary's error hierarchy and the one status-code mapping.

Owns what a failure at the API server means for the watch loop: permanent
until the environment changes (``KubernetesConfigError``), retried with
backoff while the cache is kept (``TransientKubernetesError``), relist
(``ResourceExpired``), resume from the last good version
(``WatchStreamCorrupt``), skip one pod (``PodParseError``), or read again and redo a
write (``Conflict``: the node patch of the startup taint).
``map_api_error`` is the only place an exception from the HTTP side
(``ApiStatus``: a non-2xx answer or a watch ERROR event; urllib3 and socket
errors) becomes one of these; the cause is chained by the caller
(``raise map_api_error(...) from e``).

Every class is a ``DiscoveryError`` (shaperd/core/errors.py): the API server
is where the agent discovers the pods on its node, so one that reaches a
reconcile is counted as error kind "discovery". Messages read "verb
object: cause".

Must not: retry, log or decide backoff; that is the watcher's.
"""

from __future__ import annotations

from typing import Any

from shaperd.core.errors import DiscoveryError


class ApiStatus(Exception):
    """The API server answered with a non-2xx status (or a watch ERROR event carrying one).

    Raised by ``transport`` and ``watchstream``, never seen by the watch loops:
    ``map_api_error`` turns it into one of the classes below."""

    def __init__(self, status: int | None, reason: str = "", message: str = ""):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"HTTP {status} {reason}".strip() + (f": {message}" if message else ""))


class KubernetesError(DiscoveryError):
    """A request to the API server failed or returned something unusable: 'verb object: cause'."""

    def __init__(self, verb: str, obj: str, cause: str, status: int | None = None):
        self.verb, self.obj, self.cause, self.status = verb, obj, cause, status
        super().__init__(f"{verb} {obj}: {cause}")


class KubernetesConfigError(KubernetesError):
    """No usable credentials (no service account, no kubeconfig, a kubeconfig field that is wrong or
    unsupported). Permanent until the environment changes."""


class TransientKubernetesError(KubernetesError):
    """Connection refused/reset, timeout, 5xx, 429: retried with backoff, cache kept."""


class ResourceExpired(KubernetesError):
    """410 Gone: our resourceVersion is older than the server's history. Relist."""


class Conflict(TransientKubernetesError):
    """409 Conflict, or 422 from a JSON patch whose ``test`` op failed: the object changed since it was
    read. Read it again and redo the change (the startup taint's node patch)."""


class WatchStreamCorrupt(TransientKubernetesError):
    """A watch line that is not a watch event (not JSON, no type, no object). Resume from the last good version."""


class PodParseError(KubernetesError):
    """One pod object is missing a field or has a wrong type; that pod is skipped, others are not."""

    def __init__(self, pod: str, path: str, expected: str, got: Any):
        self.pod, self.path = pod, path
        super().__init__("parse", f"pod {pod}", f"{path}: expected {expected}, got {got!r:.80}")


def map_api_error(verb: str, obj: str, exc: BaseException) -> KubernetesError:
    """The one place an exception from the HTTP side becomes one of ours."""
    import urllib3.exceptions

    if isinstance(exc, KubernetesError):
        return exc
    if isinstance(exc, ApiStatus):
        status = exc.status if isinstance(exc.status, int) else None
        cause = f"HTTP {exc.status} {exc.reason or ''}".strip() + (f": {exc.message[:200]}" if exc.message else "")
        if status == 410:
            return ResourceExpired(verb, obj, cause, status)
        if status in (401, 403):
            # Not transient in kopf's sense, but a token rotation or RBAC fix
            # heals it without a restart, so it is still retried (slowly).
            return KubernetesError(verb, obj, f"{cause} (check the service account's RBAC for {verb} of it)", status)
        if status in (409, 422):
            return Conflict(verb, obj, cause, status)
        return TransientKubernetesError(verb, obj, cause, status)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, ValueError)):
        return TransientKubernetesError(verb, obj, f"{type(exc).__name__}: {exc}")
    return KubernetesError(verb, obj, f"unexpected {type(exc).__name__}: {exc}")
