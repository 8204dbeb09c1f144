"""Which classifier path each shaped device uses, as a metric: shaperd_classifier_info{device,path}.

Owns only the exposition of what the HTB backend recorded at its last
stats() (HtbBackend.classifier_paths); reads nothing from the kernel.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


class ClassifierCollector:
    def __init__(self, backend):
        self.backend = backend

    def collect(self):
        fam = GaugeMetricFamily("shaperd_classifier_info", "1 for the classifier path in use on the device: "
                                "ebpf (map classifier on clsact egress) or u32 (filters on the HTB root)",
                                labels=["device", "path"])
        for dev, path in sorted(self.backend.classifier_paths.items()):
            fam.add_metric([dev, path], 1)
        yield fam


def install(metrics, backends) -> None:
    """Add the ``classifier`` collector when an HTB backend runs."""
    from ..backends.htb.backend import HtbBackend

    b = next((b for b in backends if isinstance(b, HtbBackend)), None)
    if b is not None:
        metrics.collectors.collectors["classifier"] = ClassifierCollector(b)
