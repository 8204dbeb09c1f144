"""Pure bed logic: iperf3 JSON goodput, windows, convergence, ping parsing."""
import json
import math
from pathlib import Path

import pytest

from shaperd_bed.parse import (IperfError, Sample, convergence_time, first_reach, max_window_rate,
                               mean_rate, parse_iperf, parse_ping, percentile, samples_from,
                               parse_tc_class_stats, summarize, window_rates, wire_rate)

FX = Path(__file__).parent / "fixtures" / "bed"


def load(name):
    return (FX / name).read_text()


def test_goodput_is_receiver_side_sum_received():
    client = json.loads(load("tcp_client_2flows.json"))
    res = parse_iperf(client, load("tcp_server_2flows.json"))
    assert res.protocol == "TCP"
    assert res.streams == 2
    assert res.received_bps == client["end"]["sum_received"]["bits_per_second"]
    assert res.sent_bps == client["end"]["sum_sent"]["bits_per_second"]
    assert res.mss == 1448
    # a 1 Gbit/s TBF: goodput can't exceed 1448/1514 of it
    assert 0 < res.received_bps < 1e9 * 1448 / 1514 * 1.02
    # iperf3's own CPU figures: the sender's process and the receiver's, % of one CPU
    cpu = client["end"]["cpu_utilization_percent"]
    assert (res.sender_cpu_percent, res.receiver_cpu_percent) == (cpu["host_total"], cpu["remote_total"])
    assert res.to_dict()["sender_cpu_percent"] == cpu["host_total"]
    assert parse_iperf({"end": {}}).sender_cpu_percent is None


def test_receiver_samples_come_from_the_server():
    res = parse_iperf(load("tcp_client_2flows.json"), load("tcp_server_2flows.json"))
    server = json.loads(load("tcp_server_2flows.json"))
    assert [s.bps for s in res.samples] == [iv["sum"]["bits_per_second"] for iv in server["intervals"]]
    assert res.sender_samples and res.sender_samples != res.samples


def test_without_server_json_falls_back_to_sender_intervals():
    res = parse_iperf(load("tcp_client_2flows.json"))
    assert res.samples == res.sender_samples


def test_fine_intervals_cover_the_run():
    s = samples_from(json.loads(load("tcp_server_i01.json")))
    assert len(s) >= 19
    assert all(abs(x.seconds - 0.1) < 0.02 for x in s[:-1])
    assert s[0].start == 0


def test_iperf_error_is_raised():
    with pytest.raises(IperfError):
        parse_iperf({"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server"})


def test_wire_rate_adds_tcp_headers():
    assert wire_rate(1448e6) == pytest.approx(1514e6)
    res = parse_iperf(load("tcp_client_2flows.json"))
    assert res.wire_bps() == pytest.approx(res.received_bps * 1514 / 1448)


def _ss(rates, step=0.1):
    return [Sample(i * step, (i + 1) * step, r) for i, r in enumerate(rates)]


def test_window_rates_slide_by_one_sample():
    s = _ss([100] * 10 + [200] * 10)
    w = window_rates(s, 1.0)
    assert len(w) == 11
    assert w[0] == pytest.approx(100)
    assert w[-1] == pytest.approx(200)
    assert w[5] == pytest.approx(150)


def test_max_window_catches_a_one_second_burst_inside_a_longer_run():
    s = _ss([100] * 20 + [130] * 10 + [100] * 20)
    assert max_window_rate(s, 1.0) == pytest.approx(130)
    assert mean_rate(s) == pytest.approx(106)
    assert max_window_rate(s, 1.0, skip=3.0) == pytest.approx(100)


def test_short_series_has_no_window():
    assert max_window_rate(_ss([1, 2, 3]), 1.0) is None


def test_convergence_requires_holding():
    s = _ss([0, 50, 210, 90, 100, 205, 200, 199, 210, 200, 200, 200])
    assert first_reach(s, 200) == pytest.approx(0.3)
    # 0.5 s rolling averages from sample 5 on are all >= 195
    assert convergence_time(s, 195, hold=0.5) == pytest.approx(0.6)
    assert convergence_time(s, 500) is None


def test_ping_parse():
    st = parse_ping(load("ping.txt"))
    assert st.sent == 10 and st.received == len(st.rtts_ms) == 10
    assert st.loss_percent == 0
    d = st.to_dict()
    assert d["min_ms"] <= d["p50_ms"] <= d["p99_ms"] <= d["max_ms"]


def test_ping_loss():
    text = ("64 bytes from 198.18.254.2: icmp_seq=1 ttl=62 time=0.1 ms\n"
            "4 packets transmitted, 1 received, 75% packet loss, time 3ms\n")
    st = parse_ping(text)
    assert st.loss_percent == 75
    assert st.rtts_ms == [0.1]


def test_percentile_and_summary():
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 90) == pytest.approx(9)
    s = summarize([1.0, 2.0, 3.0, None])
    assert s["n"] == 3 and s["mean"] == 2 and math.isclose(s["stdev"], 1.0)
    assert summarize([])["mean"] is None


def test_udp_fixture_shapes():
    snd = json.loads(load("udp_send.json"))
    snk = json.loads(load("udp_sink.json").strip().splitlines()[-1])
    assert snd["gso"] is True and snd["bits_per_second"] > 1.5e9
    assert snk["samples"] and snk["bytes"] > 0


def test_tc_class_stats_text():
    text = """class htb 1:1 root rate 1Gbit ceil 1Gbit burst 1375b cburst 1375b
 Sent 1000 bytes 10 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
class htb 1:10 parent 1:1 leaf 8001: prio 1 rate 400Mbit ceil 600Mbit burst 1600b cburst 1600b
 Sent 750 bytes 5 pkt (dropped 3, overlimits 7 requeues 0)
 backlog 0b 0p requeues 0
"""
    st = parse_tc_class_stats(text)
    assert st["1:1"]["bytes"] == 1000
    assert st["1:10"] == {"kind": "htb", "bytes": 750, "packets": 5, "drops": 3, "overlimits": 7}
