"""RDMA port counters: the sysfs reader on fixture trees, and the pure accounting with an injected clock."""

from __future__ import annotations

import shutil

import pytest

from shaperd.discovery import rdma as rdma_discovery
from shaperd.discovery import rdma_counters as rc
from shaperd.report.rdma_accounting import PortTarget, RdmaAccumulator
from shaperd.report.rdma_sampler import RdmaSampler, RdmaSamplerSettings, targets_of
from shaperd.core.roots import Roots

from ..rdma_fixture import Node

MAX32 = 2**32 - 1


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path).build()


def roots(node) -> Roots:
    return Roots.of(sys=str(node.sys))


def port_dir(node, dev="mlx5_1", port=1):
    return node.sys / "class" / "infiniband" / dev / "ports" / str(port)


# -- the reader -------------------------------------------------------------------------------------

def test_extended_counters_bytes_are_words_times_four_and_hw_counters_are_read(node):
    node.set_counter("mlx5_1", 1, "port_xmit_data", 5_000_000_000)  # past 2^32: only a 64-bit counter gets here
    node.set_counter("mlx5_1", 1, "port_xmit_packets", 70)
    node.set_counter("mlx5_1", 1, "port_xmit_wait", 9)
    node.set_counter("mlx5_1", 1, "np_cnp_sent", 3, hw=True)
    c = rc.read_port(roots(node), "mlx5_1", 1)
    assert (c.xmit_data_words, c.xmit_bytes, c.xmit_packets, c.xmit_wait) == (5_000_000_000, 20_000_000_000, 70, 9)
    assert c.extended is True and c.width_bits(rc.XMIT_DATA) == 64 and c.width_bits(rc.XMIT_WAIT) == 32
    assert dict(c.hw) == {"np_cnp_sent": 3, "out_of_sequence": 0, "rp_cnp_handled": 0}  # "lifespan" is a setting
    assert c.notes == ()


def test_legacy_32_bit_counters_saturate_and_a_value_past_2_32_proves_64_bits(node):
    (port_dir(node) / "counters" / rc.EXTENDED_MARKER).unlink()
    node.set_counter("mlx5_1", 1, "port_xmit_data", MAX32)
    c = rc.read_port(roots(node), "mlx5_1", 1)
    assert c.extended is None and c.saturated(rc.XMIT_DATA, c.xmit_data_words)
    assert not c.saturated(rc.XMIT_DATA, MAX32 - 1)
    node.set_counter("mlx5_1", 1, "port_xmit_packets", MAX32 + 1)  # a NoIETF 64-bit port: no marker file
    c = rc.read_port(roots(node), "mlx5_1", 1)
    assert c.extended is True and not c.saturated(rc.XMIT_DATA, MAX32)
    assert c.saturated(rc.XMIT_WAIT, MAX32)  # PortXmitWait is 32 bits wide whatever the port has


def test_a_port_without_counters_dir_like_rxe_has_no_bytes_but_its_hw_counters(node):
    shutil.rmtree(port_dir(node, "mlx5_0") / "counters")
    c = rc.read_port(roots(node), "mlx5_0", 1)
    assert not c.has_counters_dir and (c.xmit_bytes, c.xmit_packets, c.xmit_wait) == (None, None, None)
    assert "no counters/ directory" in c.notes[0] and "mlx5_0:1" in c.notes[0]
    assert set(c.hw) == {"np_cnp_sent", "out_of_sequence", "rp_cnp_handled"}


def test_bad_files_are_noted_by_name_and_read_as_unknown(node):
    d = port_dir(node) / "counters"
    (d / "port_xmit_data").write_text("N/A (no PMA)\n")
    (d / "port_xmit_packets").unlink()
    (d / "port_xmit_packets").mkdir()  # reading it fails with EISDIR, as an unreadable attribute would
    c = rc.read_port(roots(node), "mlx5_1", 1)
    assert c.xmit_data_words is None and c.xmit_packets is None and c.xmit_wait == 0
    assert any("counters/port_xmit_data reads 'N/A (no PMA)', not a counter" in n for n in c.notes)
    assert any("counters/port_xmit_packets unreadable: Is a directory" in n for n in c.notes)


def test_a_port_that_is_gone_reads_as_none_and_ports_list_in_numeric_order(node):
    assert rc.read_port(roots(node), "mlx5_9", 1) is None and rc.read_port(roots(node), "mlx5_1", 2) is None
    for n in (2, 10):
        (node.sys / "class" / "infiniband" / "mlx5_1" / "ports" / str(n)).mkdir()
    assert [p for p in rc.list_ports(roots(node)) if p[0] == "mlx5_1"] == [("mlx5_1", 1), ("mlx5_1", 2), ("mlx5_1", 10)]


# -- the accounting (pure, injected time) -----------------------------------------------------------

T = {("mlx5_1", 1): PortTarget("mlx5_1", 1, "tenant-a", "InfiniBand")}


def feed(acc, node, t, words=None, **kw):
    if words is not None:
        node.set_counter("mlx5_1", 1, "port_xmit_data", words)
    for k, v in kw.items():
        node.set_counter("mlx5_1", 1, k, v, hw=k.startswith(("np_", "rp_")))
    acc.ingest(t, rc.read_ports(roots(node), T), T)
    return acc.view()[0]


def test_bytes_totals_and_rates_over_the_window(node):
    acc = RdmaAccumulator(rate_window_s=2.0)
    s = feed(acc, node, 10.0, 1000, port_xmit_packets=10)
    assert (s.bytes_total, s.packets_total, s.rate_bps) == (4000, 10, None)  # one sample: no rate yet
    s = feed(acc, node, 10.5, 1000 + 125_000, port_xmit_packets=60, np_cnp_sent=5)
    assert s.bytes_total == 504_000 and s.rate_bps == 125_000 * 4 * 8 / 0.5 and s.packet_rate_pps == 100
    assert s.hw_totals["np_cnp_sent"] == 5 and s.hw_rates_per_s["np_cnp_sent"] == 10
    for i, t in enumerate((11.0, 11.5, 12.0, 12.5, 13.0), start=2):
        s = feed(acc, node, t, 1000 + 125_000 * i)
    assert s.rate_bps == 125_000 * 4 * 8 / 0.5  # steady, over the last 2 s of samples
    assert s.target.tenant == "tenant-a" and s.resets == 0 and s.saturated == ()


def test_a_counter_that_went_down_starts_a_new_baseline_never_a_negative_delta(node):
    acc = RdmaAccumulator()
    feed(acc, node, 0.0, 10_000)
    feed(acc, node, 1.0, 20_000)
    s = feed(acc, node, 2.0, 300)  # reset (perfquery -R, driver reload)
    assert s.bytes_total == 80_000 and s.resets == 1 and s.rate_bps is None
    s = feed(acc, node, 3.0, 1300)
    assert s.bytes_total == 84_000 and s.rate_bps == 1000 * 4 * 8


def test_a_saturated_32_bit_counter_is_withheld_until_reset_never_a_frozen_total(node):
    (port_dir(node) / "counters" / rc.EXTENDED_MARKER).unlink()
    acc = RdmaAccumulator()
    feed(acc, node, 0.0, MAX32 - 1000)
    s = feed(acc, node, 1.0, MAX32)
    assert s.bytes_total is None and s.rate_bps is None and s.saturated == ("port_xmit_data",)
    assert any("stuck at 2^32-1" in n and "perfquery -R" in n for n in s.notes)
    s = feed(acc, node, 2.0, MAX32)
    assert s.bytes_total is None
    s = feed(acc, node, 3.0, 50)  # reset by the operator: a new baseline
    assert s.saturated == () and s.bytes_total == (MAX32 - 1000) * 4 + 1000 * 4 and s.rate_bps is None
    s = feed(acc, node, 4.0, 150)
    assert s.bytes_total == MAX32 * 4 + 400 and s.rate_bps == 100 * 4 * 8


def test_an_unreadable_port_has_no_figures_and_the_gap_is_counted_when_it_reads_again(node):
    acc = RdmaAccumulator()
    feed(acc, node, 0.0, 100)
    acc.ingest(1.0, {}, T)  # the read failed
    s = acc.view()[0]
    assert not s.readable and s.bytes_total is None and s.hw_totals == {} and "unreadable" in s.notes[0]
    s = feed(acc, node, 2.0, 600)
    assert s.readable and s.bytes_total == 2400 and s.rate_bps is None  # counted; a rate needs two reads again
    s = feed(acc, node, 3.0, 700)
    assert s.rate_bps == 400 * 8


def test_a_port_without_counters_gives_no_bytes_figures_only_hw_ones(node):
    shutil.rmtree(port_dir(node) / "counters")
    acc = RdmaAccumulator()
    feed(acc, node, 0.0)
    s = feed(acc, node, 1.0, np_cnp_sent=4)
    assert (s.bytes_total, s.packets_total, s.wait_total, s.rate_bps) == (None, None, None, None)
    assert s.hw_totals["np_cnp_sent"] == 4 and s.hw_rates_per_s["np_cnp_sent"] == 4


def test_owners_come_from_the_plan_and_a_port_gone_from_the_node_loses_its_series(node):
    devs, _ = rdma_discovery.discover(roots(node))
    targets = targets_of(devs, {("mlx5_2", 1): "tenant-b"})
    assert len(targets) == 4 and targets[("mlx5_2", 1)].tenant == "tenant-b"
    assert targets[("mlx5_0", 1)].tenant is None and targets[("mlx5_1", 1)].link_layer == "InfiniBand"
    acc = RdmaAccumulator()
    acc.ingest(0.0, rc.read_ports(roots(node), targets), targets)
    assert len(acc.view()) == 4
    del targets[("mlx5_3", 1)]
    acc.ingest(1.0, rc.read_ports(roots(node), targets), targets)
    assert [s.target.device for s in acc.view()] == ["mlx5_0", "mlx5_1", "mlx5_2"]


def test_the_sampler_publishes_snapshots_and_a_failed_read_keeps_the_last_figures(node):
    clock = iter([0.0, 0.1, 1.0, 1.1, 2.0, 2.1])
    calls = []

    def read(ports):
        calls.append(ports)
        if len(calls) == 3:
            raise OSError("sysfs went away")
        return rc.read_ports(roots(node), ports)

    s = RdmaSampler(read, RdmaSamplerSettings(), clock=lambda: next(clock), wall=lambda: 1e9)
    s.set_targets(T)
    node.set_counter("mlx5_1", 1, "port_xmit_data", 10)
    first = s.sample_once()
    node.set_counter("mlx5_1", 1, "port_xmit_data", 20)
    second = s.sample_once()
    assert first.ok and second.ok and second.samples == 2 and second.series[0].bytes_total == 80
    assert second.series[0].rate_bps == 40 * 8 / 1.0
    third = s.sample_once()
    assert not third.ok and "sysfs went away" in third.error and third.failures == 1
    assert third.series == second.series and third.taken_at == second.taken_at
    assert calls[0] == [("mlx5_1", 1)]
