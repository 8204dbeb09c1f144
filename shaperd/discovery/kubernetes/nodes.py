"""The agent's own Node object: read it, and remove one taint from it by a guarded JSON patch.

Owns the two node requests of the startup taint (daemon/taint.py): ``get_node`` (GET
/api/v1/nodes/NAME) and ``remove_taint``, which reads the node, finds the taint by key and
effect, and sends ``[{"op": "test", "path": "/spec/taints/I", "value": <the taint as read>},
{"op": "remove", "path": "/spec/taints/I"}]``: if anyone edited the taints in between (an index
moved, the taint changed), the ``test`` fails, the API server answers 422 and the change is not
made (``Conflict``). An absent taint sends no write. Each request has a deadline; failures are
mapped by ``errors.map_api_error``.

Must not: retry, sleep or log (the caller's), or touch any other field of the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from shaperd.discovery.kubernetes.errors import KubernetesError, TransientKubernetesError, map_api_error
from shaperd.discovery.kubernetes.transport import ApiClient


@dataclass(frozen=True)
class TaintRef:
    """A taint by key and effect (its value is not matched: kubectl's `kubectl taint KEY:EFFECT-` likewise)."""

    key: str
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}:{self.effect}"

    def matches(self, taint: object) -> bool:
        return isinstance(taint, dict) and taint.get("key") == self.key and taint.get("effect") == self.effect


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"


def get_node(api: ApiClient, name: str, timeout_s: float) -> dict:
    """The Node object; a ``KubernetesError`` naming the node when it cannot be read."""
    what = f"node {name}"
    try:
        doc = api.get_json(node_path(name), None, (min(10.0, timeout_s), timeout_s))
    except ValueError as e:
        raise TransientKubernetesError("get", what, f"response is not JSON: {e}") from e
    except Exception as e:
        raise map_api_error("get", what, e) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        raise TransientKubernetesError("get", what, "response is not a Node object (no metadata)")
    return doc


def taint_index(node: dict, taint: TaintRef) -> int | None:
    """Where ``taint`` is in the node's spec.taints, or None."""
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, dict) else None
    if not isinstance(taints, list):
        return None
    return next((i for i, t in enumerate(taints) if taint.matches(t)), None)


def remove_taint(api: ApiClient, name: str, taint: TaintRef, timeout_s: float) -> bool:
    """Remove ``taint`` from node ``name``: True if a patch removed it, False if it was absent (nothing sent).

    ``Conflict`` when the taints changed between the read and the patch (read again and retry)."""
    node = get_node(api, name, timeout_s)
    i = taint_index(node, taint)
    if i is None:
        return False
    value = node["spec"]["taints"][i]
    ops = [{"op": "test", "path": f"/spec/taints/{i}", "value": value},
           {"op": "remove", "path": f"/spec/taints/{i}"}]
    what = f"node {name}"
    try:
        doc = api.patch_json(node_path(name), ops, (min(10.0, timeout_s), timeout_s))
    except ValueError as e:
        raise TransientKubernetesError("patch", what, f"response is not JSON: {e}") from e
    except KubernetesError:
        raise
    except Exception as e:
        raise map_api_error("patch", what, e) from e
    if isinstance(doc, dict) and taint_index(doc, taint) is not None:
        # A second copy of the taint (same key and effect) stays: the next attempt removes it.
        raise TransientKubernetesError("patch", what, f"taint {taint} still present after the patch")
    return True
