"""Volcano queues: which queue a pod is in, and tenant priority from the queue's weight.

Owns ``VolcanoView``: two generic watches (resources.py) of
``scheduling.volcano.sh/v1beta1`` PodGroups (all namespaces) and Queues
(cluster-scoped). A pod's queue is its PodGroup's ``spec.queue`` (the PodGroup
named by the pod's ``scheduling.k8s.io/group-name`` annotation, in the pod's
namespace); failing that its ``volcano.sh/queue-name`` label or annotation,
then ``scheduling.volcano.sh/queue-name``. A tenant with ``priorityFrom:
volcanoQueue`` takes the ``spec.weight`` of its queue (the largest of its
``match.volcanoQueues`` that exist); until one is known it keeps the
configured priority. Without Volcano (404 on the group) the watches say so
once and every pod simply has no queue.

Must not: change the tenants file on disk or anything in the API; the
functions below are pure, the view only keeps the two caches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from shaperd.core.config import Config
from shaperd.discovery.kubernetes.pods import GROUP_NAME_ANNOTATION, QUEUE_NAME_KEYS, PodInfo
from shaperd.discovery.kubernetes.resources import ResourceWatcher

GROUP = "/apis/scheduling.volcano.sh/v1beta1"
PODGROUPS = f"{GROUP}/podgroups"
QUEUES = f"{GROUP}/queues"


def uses_volcano(cfg: Config | None) -> bool:
    return cfg is not None and any(t.match.volcano_queues or t.priority_from == "volcanoQueue" for t in cfg.tenants)


def queue_of(pod: PodInfo, podgroups: Mapping[str, dict]) -> str | None:
    """The pod's Volcano queue, or None."""
    group = pod.annotations.get(GROUP_NAME_ANNOTATION)
    if group:
        spec = (podgroups.get(f"{pod.namespace}/{group}") or {}).get("spec")
        q = spec.get("queue") if isinstance(spec, dict) else None
        if isinstance(q, str) and q:
            return q
    for key in QUEUE_NAME_KEYS:
        q = pod.labels.get(key) or pod.annotations.get(key)
        if q:
            return q
    return None


def queue_weights(queues: Mapping[str, dict]) -> dict[str, int]:
    out = {}
    for name, q in queues.items():
        spec = q.get("spec") if isinstance(q, dict) else None
        w = spec.get("weight") if isinstance(spec, dict) else None
        if isinstance(w, int) and not isinstance(w, bool) and w >= 0:
            out[name] = w
    return out


def with_queue_priorities(cfg: Config, weights: Mapping[str, int]) -> Config:
    """``cfg`` with each ``priorityFrom: volcanoQueue`` tenant's priority set to its queue's weight."""
    tenants = []
    changed = False
    for t in cfg.tenants:
        if t.priority_from == "volcanoQueue":
            known = [weights[q] for q in t.match.volcano_queues if q in weights]
            if known and max(known) != t.priority:
                t = dataclasses.replace(t, priority=max(known))
                changed = True
        tenants.append(t)
    return dataclasses.replace(cfg, tenants=tuple(tenants)) if changed else cfg


class VolcanoView:
    """PodGroups and Queues through the API, for pod -> queue and queue weights."""

    def __init__(self, on_change: Callable[[], None], **watch_kw: Any):
        self.podgroups = ResourceWatcher(PODGROUPS, on_change, what="volcano podgroups", **watch_kw)
        self.queues = ResourceWatcher(QUEUES, on_change, what="volcano queues", **watch_kw)

    def start(self) -> None:
        self.podgroups.start()
        self.queues.start()

    def stop(self) -> None:
        self.podgroups.stop()
        self.queues.stop()

    @property
    def has_synced(self) -> bool:
        return self.podgroups.has_synced and self.queues.has_synced

    def with_queues(self, pods: list[PodInfo]) -> list[PodInfo]:
        groups = self.podgroups.snapshot()
        return [dataclasses.replace(p, volcano_queue=queue_of(p, groups)) for p in pods]

    def effective(self, cfg: Config) -> Config:
        return with_queue_priorities(cfg, queue_weights(self.queues.snapshot()))
