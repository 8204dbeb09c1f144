"""Which classifier path is in use: the status section (from kernel rows) and shaperd_classifier_info."""

from types import SimpleNamespace

from shaperd.backends.common import mapcls
from shaperd.kernel.rtnl_rows import FilterRow, LinkRow, QdiscRow
from shaperd.backends.htb import metrics as classifier_metrics
from shaperd.backends.htb import classifier_status


class Reader:
    def __init__(self, egress):
        self.egress = egress

    def qdiscs(self):
        return [QdiscRow(ifindex=2, parent=0xFFFFFFFF, handle=0x73680000, kind="htb"),
                QdiscRow(ifindex=3, parent=0xFFFFFFFF, handle=0x73680000, kind="htb"),
                QdiscRow(ifindex=2, parent=0xFFFFFFF1, handle=0xFFFF0000, kind="clsact"),
                QdiscRow(ifindex=4, parent=0xFFFFFFFF, handle=0x10000, kind="htb")]

    def links(self):
        return [LinkRow(2, "eth0", "", 1500, True), LinkRow(3, "eth1", "", 1500, True),
                LinkRow(4, "eth2", "", 1500, True)]

    def filters(self, ifindex, parent, device):
        assert parent == 0xFFFFFFF3
        return self.egress if ifindex == 2 else []


def test_status_says_ebpf_only_where_our_filter_is_on_clsact_egress():
    name = mapcls.program_name(0xFF)
    ours = FilterRow(2, 0xFFFFFFF3, mapcls.PRIO_EGRESS_CLASSIFY, 3, 0x7368, "bpf", name=name, prog_id=42)
    foreign = FilterRow(2, 0xFFFFFFF3, 1, 3, 1, "bpf", name="cil_to_netdev", prog_id=7)
    paths = classifier_status.collect(Reader([foreign, ours]))
    assert paths == {"eth0": {"path": "ebpf", "program": name, "prog_id": 42, "htb_offload": "off"},
                     "eth1": {"path": "u32", "program": None, "prog_id": None, "htb_offload": "off"}}  # eth2: foreign
    text = classifier_status.render(paths)
    assert f"eth0: ebpf (program {name}, id 42)" in text and "eth1: u32" in text
    assert classifier_status.collect(Reader([foreign]))["eth0"]["path"] == "u32"


def test_classifier_info_metric_has_one_series_per_device():
    from shaperd.backends.htb.backend import HtbBackend

    b = HtbBackend(writer=None)
    b.classifier_paths = {"eth0": "ebpf", "eth1": "u32"}
    metrics = SimpleNamespace(collectors=SimpleNamespace(collectors={}))
    classifier_metrics.install(metrics, [object(), b])
    (fam,) = list(metrics.collectors.collectors["classifier"].collect())
    assert fam.name == "shaperd_classifier_info"
    assert sorted((s.labels["device"], s.labels["path"], s.value) for s in fam.samples) == [
        ("eth0", "ebpf", 1), ("eth1", "u32", 1)]


class OffloadReader(Reader):
    def qdiscs(self):
        return [QdiscRow(ifindex=2, parent=0xFFFFFFFF, handle=0x73680000, kind="htb", offload=True),
                QdiscRow(ifindex=3, parent=0xFFFFFFFF, handle=0x73680000, kind="htb")]


class Probe:
    def probe(self, links):
        from shaperd.core.inventory import HtbOffloadSupport

        return {l.name: HtbOffloadSupport(False, "driver virtio_net is not known to offload HTB") for l in links}


def test_status_says_htb_offload_on_from_the_dump_and_why_off_from_the_device_probe():
    paths = classifier_status.collect(OffloadReader([]), Probe())
    assert paths["eth0"]["htb_offload"] == "on" and "htb_offload_why" not in paths["eth0"]
    assert paths["eth1"] == {"path": "u32", "program": None, "prog_id": None, "htb_offload": "off",
                             "htb_offload_why": "driver virtio_net is not known to offload HTB"}
    text = classifier_status.render(paths)
    assert "eth0: htb offload: on" in text
    assert "eth1: htb offload: off (driver virtio_net is not known to offload HTB)" in text


def test_status_gives_the_kernels_refusal_recorded_by_the_applying_process_before_the_device_probe():
    from shaperd.core.inventory import HtbOffloadSupport

    class Capable:
        def probe(self, links):
            return {l.name: HtbOffloadSupport(True, "mlx5_core with hw-tc-offload on") for l in links}

    paths = classifier_status.collect(OffloadReader([]))
    links = [SimpleNamespace(name="eth0"), SimpleNamespace(name="eth1")]
    refused = {"eth1": {"ifindex": 3, "reason": "Operation not supported (prio and quantum ...)"}}
    out = classifier_status.with_offload_reasons(paths, links, Capable(), refused)
    assert out["eth1"]["htb_offload_why"] == "the kernel refused htb offload: Operation not supported (prio and quantum ...)"
    assert "htb_offload_why" not in out["eth0"]  # offloaded: nothing to explain
    plain = classifier_status.with_offload_reasons(classifier_status.collect(OffloadReader([])), links, Capable())
    assert plain["eth1"]["htb_offload_why"].startswith("the device can offload; the plan keeps it in software")


def test_htb_offload_metric_is_one_where_offloaded_and_zero_where_not():
    from shaperd.backends.htb.backend import HtbBackend

    b = HtbBackend(writer=None)
    b.offload = {"eth0": (True, "mlx5_core, hw-tc-offload on"), "eth1": (False, "node.htbOffload is off")}
    metrics = SimpleNamespace(collectors=SimpleNamespace(collectors={}))
    classifier_metrics.install(metrics, [b])
    (fam,) = list(metrics.collectors.collectors["htb_offload"].collect())
    assert fam.name == "shaperd_htb_offload"
    assert sorted((s.labels["device"], s.value) for s in fam.samples) == [("eth0", 1), ("eth1", 0)]
