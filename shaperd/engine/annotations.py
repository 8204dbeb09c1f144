"""The ledger of refused pod bandwidth annotations: each refused value said once, and counted once.

``Tenancy.invalid_annotations`` (core/podcaps.py) is worked out afresh on every reconcile, so a pod
annotated ``kubernetes.io/egress-bandwidth: fast`` would be warned about every resync. The ledger keeps
what it has said, one entry per (pod uid, key, value, reason): the same refusal on the next reconcile is
not news; a changed value is a new refusal (said and counted again); a pod that goes away, or whose value
became valid or was removed, is forgotten, so a value that comes back later is said again.

Owns the ledger and the family ``shaperd_pod_annotation_invalid_total{reason}``: refusals counted when
first seen, by reason, every reason of ``podcaps.REASONS`` exported from 0 (so ``rate()`` and
``increase()`` see the first one). The reconciler feeds it after each apply and logs what it returns;
the daemon adds its collector to the metrics endpoint.

Must not: decide anything about enforcement (the pod stays in its tenant, uncapped: tenancy's rule), or
be used by the read-only commands (plan and diff run once and print every refusal).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from shaperd.core.podcaps import REASONS, InvalidAnnotation

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

FAMILY = "shaperd_pod_annotation_invalid"  # prometheus_client adds _total to a counter's samples
HELP = ("Pod bandwidth annotation values refused (kubernetes.io/egress-bandwidth, ingress-bandwidth), by reason, "
        "counted once per pod, key and value when first seen; the pod stays in its tenant, uncapped in that "
        "direction, and the log names it")


def _key(a: InvalidAnnotation) -> tuple[str, str, str, str]:
    return (a.uid, a.key, a.value, a.reason)


class AnnotationLedger:
    """What has been said about refused annotations, and how many were refused, by reason."""

    def __init__(self):
        self._said: set[tuple[str, str, str, str]] = set()
        self._counts: dict[str, int] = {r: 0 for r in REASONS}
        self._lock = threading.Lock()  # counts are read by the metrics thread

    def observe(self, refused: Iterable[InvalidAnnotation]) -> list[InvalidAnnotation]:
        """This reconcile's refusals -> those not said before (to log now); counts them. What is no longer
        refused (pod gone, value changed, fixed or removed) is forgotten."""
        now: dict[tuple[str, str, str, str], InvalidAnnotation] = {}
        for a in refused:
            now.setdefault(_key(a), a)
        new = [a for k, a in now.items() if k not in self._said]
        with self._lock:
            for a in new:
                self._counts[a.reason] = self._counts.get(a.reason, 0) + 1
            self._said = set(now)
        return new

    def counts(self) -> dict[str, int]:
        """reason -> refusals counted so far (every reason present, from 0)."""
        with self._lock:
            return dict(self._counts)

    @property
    def current(self) -> int:
        """How many refusals stand now (as of the last reconcile)."""
        return len(self._said)

    def collector(self) -> Collector:
        return _LedgerCollector(self)


class _LedgerCollector:  # prometheus_client's Collector is a Protocol: collect() is all it needs
    def __init__(self, ledger: AnnotationLedger):
        self.ledger = ledger

    def collect(self):
        # Imported here: prometheus_client (http.server, wsgiref, urllib.request: ~40 modules) is the daemon's,
        # which serves metrics, not every command that opens a reconciler (status, diff; BENCHMARKS.md "status cost").
        from prometheus_client.core import CounterMetricFamily

        fam = CounterMetricFamily(FAMILY, HELP, labels=["reason"])
        for reason, n in sorted(self.ledger.counts().items()):
            fam.add_metric([reason], n)
        yield fam
