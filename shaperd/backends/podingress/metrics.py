"""Prometheus series for the per-pod ingress caps, read at scrape time from shaperd's tbf on each pod's interface.

- ``shaperd_pod_receive_bytes_total{namespace,pod,tenant,device}``: bytes the pod received through its
  tbf (what the qdisc sent towards the pod, L2 frame length);
- ``shaperd_pod_receive_limit_bytes_per_second{...}``: the cap that tbf enforces, as the kernel reads it back.

Only for pods with an ingress cap whose interface holds shaperd's tbf 7368: (the last plan's pods, labels from
it; tenant "" for a pod of no tenant; device: the pod's host interface). A pod whose interface is left alone
(a foreign root qdisc) or not yet enforced has no series: missing is missing. One qdisc dump per scrape, on a
reader of the agent's namespace kept between scrapes (reopened after a failure, which fails this collector's
scrape, not the others'). At 100 capped pods: 200 series.
"""

from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shaperd.backends.podingress.objects import TC_H_ROOT, ROOT_HANDLE, OWN_KIND

LABELS = ["namespace", "pod", "tenant", "device"]


class PodIngressCollector(Collector):
    def __init__(self, backend, open_reader):
        """``open_reader()``: a kernel.rtnl.RtnlReader in the agent's namespace."""
        self.backend, self.open_reader = backend, open_reader
        self._reader = None
        self._lock = threading.Lock()

    def _roots(self) -> dict:
        with self._lock:
            if self._reader is None:
                self._reader = self.open_reader()
            try:
                qdiscs = self._reader.qdiscs()
            except Exception:
                self._reader.close()
                self._reader = None
                raise
        return {q.ifindex: q for q in qdiscs if q.parent == TC_H_ROOT and q.kind == OWN_KIND and q.handle == ROOT_HANDLE}

    def collect(self):
        got = CounterMetricFamily("shaperd_pod_receive_bytes", "Bytes the pod received through its ingress cap "
                                  "(shaperd's tbf on its host interface; L2 frame length)", labels=LABELS)
        lim = GaugeMetricFamily("shaperd_pod_receive_limit_bytes_per_second", "The pod's ingress cap "
                                "(kubernetes.io/ingress-bandwidth) as its tbf enforces it, bytes per second",
                                labels=LABELS)
        pods = self.backend.snapshot.pods
        roots = self._roots() if pods else {}
        for p in pods:
            q = roots.get(p.ifindex)
            if q is None:
                continue
            lv = [p.namespace, p.name, p.tenant or "", p.ifname]
            if q.counters is not None:
                got.add_metric(lv, q.counters.bytes)
            if q.tbf is not None:
                lim.add_metric(lv, q.tbf.rate_Bps)
        yield got
        yield lim


def install(metrics, backend) -> None:
    """Add the ``pod_ingress`` collector to a ``report.metrics.Metrics`` for a running podingress backend."""
    from shaperd.kernel.rtnl import RtnlReader

    metrics.collectors.collectors["pod_ingress"] = PodIngressCollector(
        backend, lambda: RtnlReader(backend.netns, run_root=backend.run_root))
