"""Pure bed logic: where the CPU went (a fixture /proc tree) and how traffic processes are scheduled."""
from pathlib import Path

from shaperd_bed import cpustat
from shaperd_bed.topology import Bed, BedConfig


def _proc(root: Path, stat_lines: list[str], threads: dict[int, tuple[str, int, int]]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("\n".join(stat_lines) + "\nintr 1 2 3\nctxt 9\n")
    for pid, (comm, utime, stime) in threads.items():
        d = root / str(pid)
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        (d / "stat").write_text(f"{pid} ({comm}) S 2 0 0 0 -1 69238848 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n")
    (root / "self").mkdir()  # not a pid: skipped
    return str(root)


def test_delta_gives_each_field_as_a_share_of_the_cpus_time(tmp_path):
    #                user nice system idle iowait irq softirq steal
    a = _proc(tmp_path / "a", ["cpu  100 0 50 800 0 0 50 0", "cpu0 50 0 25 400 0 0 25 0",
                               "cpu1 50 0 25 400 0 0 25 0"],
              {10: ("ksoftirqd/0", 5, 10), 11: ("ksoftirqd/1", 0, 0), 12: ("iperf3", 900, 900)})
    b = _proc(tmp_path / "b", ["cpu  200 0 150 900 0 0 150 100", "cpu0 150 0 100 400 0 0 100 50",
                               "cpu1 50 0 50 500 0 0 50 50"],
              {10: ("ksoftirqd/0", 25, 40), 11: ("ksoftirqd/1", 0, 50), 12: ("iperf3", 5000, 5000)})
    d = cpustat.delta(cpustat.snapshot(a), cpustat.snapshot(b))
    # the machine: 500 jiffies in all, 100 user, 100 system, 100 idle, 100 softirq, 100 steal
    assert d["cpu"]["user"] == 20.0 and d["cpu"]["softirq"] == 20.0 and d["cpu"]["steal"] == 20.0
    assert d["cpu"]["idle"] == 20.0 and d["cpu"]["busy"] == 60.0
    # cpu0 was never idle; cpu1 mostly was
    assert d["cpu0"]["busy"] == 83.3 and d["cpu0"]["idle"] == 0.0
    assert d["cpu1"]["idle"] == 50.0
    # only the softirq threads count: (20 + 30) + 50 ticks at the host's clock tick rate
    clk = cpustat.snapshot(a).clk_tck
    assert d["ksoftirqd_s"] == round(100 / clk, 3)


def test_a_cpu_that_appears_later_or_an_unreadable_thread_does_not_fail(tmp_path):
    a = _proc(tmp_path / "a", ["cpu  1 0 1 8 0 0 0 0", "cpu0 1 0 1 8 0 0 0 0"], {})
    b = _proc(tmp_path / "b", ["cpu  2 0 2 16 0 0 0 0", "cpu0 2 0 2 16 0 0 0 0", "cpu1 1 0 0 1 0 0 0 0"],
              {13: ("ksoftirqd/0", 1, 1)})
    (Path(b) / "13" / "stat").write_text("garbage")
    d = cpustat.delta(cpustat.snapshot(a), cpustat.snapshot(b))
    assert set(d) == {"cpu", "cpu0", "ksoftirqd_s"} and d["ksoftirqd_s"] == 0.0
    assert d["cpu"]["busy"] == 20.0


def test_traffic_runs_as_is_unless_the_bed_is_told_how_to_schedule_it():
    argv = ["iperf3", "-c", "198.18.254.2"]
    assert Bed(BedConfig()).traffic_argv(argv, "a") == argv
    bed = Bed(BedConfig(traffic_nice=-15, sender_cpus=(0, 1)))
    assert bed.traffic_argv(argv, "a") == ["nice", "-n", "-15", "taskset", "-c", "0", *argv]
    assert bed.traffic_argv(argv, "b") == ["nice", "-n", "-15", "taskset", "-c", "1", *argv]
    # servers (no tenant) are never pinned, only niced
    assert bed.traffic_argv(argv) == ["nice", "-n", "-15", *argv]
    one = Bed(BedConfig(sender_cpus=(1,)))
    assert one.traffic_argv(argv, "a") == one.traffic_argv(argv, "b") == ["taskset", "-c", "1", *argv]


def test_the_eight_tenants_fit_the_link_and_set_priority_against_flow_count():
    from shaperd_bed import many

    ts = many.eight_tenants()
    assert len(ts) == 8 and len({t.subnet_octet for t in ts}) == 8 and len({t.short for t in ts}) == 8
    assert abs(sum(t.guarantee for t in ts) - 0.90) < 1e-9 and all(t.limit == 1.0 for t in ts)
    # a 1-flow tenant of low priority beside 8-flow tenants of higher priority: the hard case
    low1 = [t for t in ts if many.flows_of(t.short) == 1]
    assert low1 and all(any(u.priority > t.priority and many.flows_of(u.short) == 8 for u in ts) for t in low1)
    for t in ts:  # interface names stay under the kernel's 15 characters
        assert all(len(n) <= 15 for n in Bed(BedConfig(tenants=ts)).interfaces())


def test_eight_tenant_figures_judge_the_steady_rate_against_each_guarantee():
    from shaperd_bed import many
    from shaperd_bed.parse import IperfResult, Sample

    bed = Bed(BedConfig(link_mbit=1000, tenants=many.eight_tenants()))
    res = {}
    for t in bed.config.tenants:
        g = t.guarantee * bed.link_bps * 1448 / 1514  # exactly the guarantee on the wire, as goodput
        # a slow first 0.5 s (left out as warm-up), then the guarantee; t3 gets only half of it
        rate = g / 2 if t.short == "t3" else g
        samples = [Sample(0.0, 0.5, rate / 10)] + [Sample(0.5 + i / 10, 0.6 + i / 10, rate) for i in range(20)]
        res[t.short] = IperfResult("TCP", many.flows_of(t.short), 2.5, rate, rate, mss=1448, samples=samples)
    figs = many.figures(bed, res, warmup_s=0.5)
    assert abs(figs["t0"]["attainment"] - 1.0) < 1e-6 and abs(figs["t3"]["attainment"] - 0.5) < 1e-6
    out = many.Outcome("shaperd", figs, {})
    assert out.worst[0] == "t3" and abs(out.worst[1] - 0.5) < 1e-6
