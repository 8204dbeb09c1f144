"""Which classifier path each shaped device uses, and whether its HTB is offloaded, as metrics.

shaperd_classifier_info{device,path} and shaperd_htb_offload{device} (1 on,
0 off). Owns only the exposition of what the HTB backend recorded at its
last stats() (HtbBackend.classifier_paths, HtbBackend.offload); reads
nothing from the kernel.
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


class HtbOffloadCollector:
    def __init__(self, backend):
        self.backend = backend

    def collect(self):
        fam = GaugeMetricFamily("shaperd_htb_offload", "1 where the device's HTB tree is offloaded to the NIC "
                                "(tc htb offload), 0 where it runs in software", labels=["device"])
        for dev, (on, _why) in sorted(self.backend.offload.items()):
            fam.add_metric([dev], 1 if on else 0)
        yield fam


def install(metrics, backends) -> None:
    """Add the ``classifier`` collector when an HTB backend runs."""
    from shaperd.backends.htb.backend import HtbBackend

    b = next((b for b in backends if isinstance(b, HtbBackend)), None)
    if b is not None:
        metrics.collectors.collectors["classifier"] = ClassifierCollector(b)
        metrics.collectors.collectors["htb_offload"] = HtbOffloadCollector(b)
