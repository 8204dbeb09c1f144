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
