"""What shaperd knows about a pod, parsed from the API server's wire JSON.

Owns ``PodInfo`` (the fields shaping depends on; its equality decides
whether a MODIFIED event matters), ``FrozenMap`` (immutable labels, so a
PodInfo is hashable), the parser and ``describe_pod`` for log lines.

Decoding is ours (there are no generated models here: strict ones would
let one odd pod abort a whole list or watch stream). Each pod
is parsed on its own and a malformed one raises ``PodParseError`` naming
the pod and the field, so the caller skips it and applies the others.

Must not: make requests or keep state.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shaperd.core.podcaps import ANNOTATIONS, NotAString
from shaperd.discovery.kubernetes.errors import PodParseError

# Volcano: the pod's PodGroup, and the queue-name fallbacks (label or annotation).
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_NAME_KEYS = ("volcano.sh/queue-name", "scheduling.volcano.sh/queue-name")
# Per-pod bandwidth caps (core/podcaps.py): a changed value is a change that matters.
BANDWIDTH_ANNOTATIONS = ANNOTATIONS
KEPT_ANNOTATIONS = frozenset({GROUP_NAME_ANNOTATION, *QUEUE_NAME_KEYS, *BANDWIDTH_ANNOTATIONS})


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
    # Only the annotations shaperd reads (KEPT_ANNOTATIONS): others churn and must not look like a change.
    annotations: Mapping[str, str] = FrozenMap()
    # Resolved by discovery/kubernetes/volcano.py from the PodGroups; not on the wire.
    volcano_queue: str | None = None

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

        ann = meta.get("annotations") or {}
        if not isinstance(ann, dict):
            raise fail("metadata.annotations", "an object of strings", ann)
        kept = {k: v for k, v in ann.items() if k in KEPT_ANNOTATIONS and isinstance(v, str)}
        for k in BANDWIDTH_ANNOTATIONS:  # a non-string value is reported as refused (podcaps), not dropped
            if k in ann and not isinstance(ann[k], str):
                kept[k] = NotAString(_json_text(ann[k]))
        return cls(
            uid=uid, namespace=ns, name=name, labels=FrozenMap(labels), ips=tuple(ips),
            host_network=host_network, qos_class=qos or None, phase=phase, node=node,
            annotations=FrozenMap(kept),
        )


def _json_text(v: Any) -> str:
    """A wire value as JSON text (what the server sent), for a refusal that names it."""
    try:
        return json.dumps(v, sort_keys=True)
    except (TypeError, ValueError):  # not from a JSON parser: a test's object, an int too long for str()
        return f"<{type(v).__name__}>"


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


def object_resource_version(obj: Any) -> str | None:
    """``metadata.resourceVersion`` of a wire object (pod, list, bookmark), or None when absent."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and rv else None
