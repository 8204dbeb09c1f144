#!/usr/bin/env python3
"""Isolation benchmark: the source design's table on real namespaces, repeated.

Builds the shaperd test bed (``shaperd_bed``, in testbed/), runs every scenario in
every mode (unshaped, shaperd, hand-written tc) ``--repeats`` times with
``--duration`` seconds of traffic per measurement, and prints markdown for
BENCHMARKS.md: mean +- stdev (min..max) over the repeats, the targets, and
the command that reproduces it.  ``--capacity`` takes several values to sweep
shaperd's node.capacity against the fixed emulated link (headroom finding).

Needs root, iproute2, iperf3, ping, and the bed installed (scripts/setup: .venv has it).
Typical: 3 repeats x 8 s = about 12 min.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shaperd_bed import report, shaping  # noqa: E402
from shaperd_bed.parse import summarize  # noqa: E402
from shaperd_bed.scenarios import MODES, SCENARIOS, Settings, run_all  # noqa: E402
from shaperd_bed.topology import Bed, BedConfig  # noqa: E402


def _stat(vals: list[float | None], nd: int = 1, unit: str = "") -> str:
    s = summarize([v for v in vals if v is not None])
    if not s["n"]:
        return "-"
    if s["n"] == 1:
        return f"{s['mean']:.{nd}f}{unit}"
    return f"{s['mean']:.{nd}f}{unit} ± {s['stdev']:.{nd}f} ({s['min']:.{nd}f}..{s['max']:.{nd}f})"


def one_round(link_mbit: int, settings: Settings, scenarios, modes, log, *, traffic_nice: int | None = None,
              sender_cpus: tuple[int, ...] = (), zerocopy: bool = False) -> list[dict]:
    cfg = BedConfig(link_mbit=link_mbit, traffic_nice=traffic_nice, sender_cpus=sender_cpus,
                    sender_zerocopy=zerocopy)
    with Bed(cfg) as bed:
        log(f"bed {bed.run_id}")
        res = run_all(bed, settings, scenarios=scenarios, modes=modes, progress=log)
    return [r.to_dict() for r in res]


def source_table(rounds: list[list[dict]], modes: tuple[str, ...]) -> str:
    rows_per_round = [report.source_rows(report.index(r), modes) for r in rounds]
    lines = ["| scenario | source A / B / link | " + " | ".join(f"{m}: A / B / link (%)" for m in modes) + " |",
             "|---|---|" + "---|" * len(modes)]
    for i, (label, _, src) in enumerate(report.SOURCE_TABLE):
        cells = []
        for m in modes:
            key = m if m in rows_per_round[0][i] else "none"
            trip = [rows[i].get(key) or {} for rows in rows_per_round]
            cells.append(" / ".join(_stat([t.get(f) for t in trip], 0) for f in ("a", "b", "link"))
                         + (" (unshaped)" if key == "none" else ""))
        lines.append(f"| {label} | {src[0]:g} / {src[1]:g} / {src[2]:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets_table(rounds: list[list[dict]], modes: tuple[str, ...]) -> str:
    per = {m: [{t.target: t for t in report.targets(report.index(r), m)} for r in rounds] for m in modes}
    lines = ["| target | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for key, text in report.TARGETS.items():
        cells = []
        for m in modes:
            vals = [x[key].value for x in per[m] if key in x]
            oks = [x[key].ok for x in per[m] if key in x and x[key].ok is not None]
            unit = " s" if key == "convergence" else (" ms p99" if key == "latency" else " %")
            verdict = "" if not oks else (" ok" if all(oks) else f" MISSED {oks.count(False)}/{len(oks)}")
            cells.append(_stat(vals, 3 if key in ("latency", "convergence") else 1, unit) + verdict)
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _per_key(rounds: list[list[dict]]):
    """(key, scenario, mode, that result of every round without an error), in the first round's order."""
    for key in (f"{d['scenario']}/{d['mode']}" for d in rounds[0]):
        ds = [report.index(r).get(key) for r in rounds]
        yield (key, *key.split("/"), [d for d in ds if d and not d.get("error")])


def detail_table(rounds: list[list[dict]]) -> str:
    lines = ["| scenario | mode | A goodput Mbit/s | B goodput Mbit/s | A % of G | B % of G | worst 1 s over L | "
             "wire TBF drops | notes |", "|---|---|---|---|---|---|---|---|---|"]
    for key, sc, mode, ds in _per_key(rounds):
        if not ds:
            lines.append(f"| {sc} | {mode} | error | | | | | | |")
            continue

        def tv(k, f):
            return [d["tenants"][k].get(f) if k in d["tenants"] else None for d in ds]

        a_g = [v / 1e6 if v else None for v in tv("a", "goodput_bps")]
        b_g = [v / 1e6 if v else None for v in tv("b", "goodput_bps")]
        worst = [max([t.get("limit_excess_pct") for t in d["tenants"].values()
                      if t.get("limit_excess_pct") is not None], default=None) for d in ds]
        drops = [d.get("qdiscs", {}).get("wire", {}).get("drops") for d in ds]
        notes = ""
        if sc == "converge":
            notes = "B settles at G in " + _stat([d["extra"].get("settle_s") for d in ds], 2, " s")
        if sc == "latency":
            notes = ("B ping p50 " + _stat([d["extra"]["rtt"].get("p50_ms") for d in ds], 3, " ms")
                     + ", p99 " + _stat([d["extra"]["rtt"].get("p99_ms") for d in ds], 3, " ms"))
            if "idle_rtt" in ds[0]["extra"]:
                notes += "; idle p50 " + _stat([d["extra"]["idle_rtt"].get("p50_ms") for d in ds], 3, " ms")
        lines.append(f"| {sc} | {mode} | {_stat(a_g, 0)} | {_stat(b_g, 0)} | {_stat(tv('a', 'pct_of_guarantee'))} | "
                     f"{_stat(tv('b', 'pct_of_guarantee'))} | {_stat(worst)} | {_stat(drops, 0)} | {notes} |")
    return "\n".join(lines)


def cpu_table(rounds: list[list[dict]]) -> str:
    """Where the CPU went in each scenario's last measurement, and what each sender offered and got."""
    lines = ["| scenario | mode | machine busy % | softirq % | steal % | ksoftirqd CPU s | A sender CPU % | "
             "B sender CPU % | A sent / got Mbit/s | B sent / got Mbit/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for _key, sc, mode, ds in _per_key(rounds):
        ds = [d for d in ds if d.get("cpu")]
        if not ds:
            continue

        def c(f):
            return [d["cpu"].get("cpu", {}).get(f) for d in ds]

        def t(k, f, scale=1.0):
            return [d["tenants"][k][f] / scale if k in d["tenants"] and d["tenants"][k].get(f) is not None
                    else None for d in ds]

        lines.append(f"| {sc} | {mode} | {_stat(c('busy'), 0)} | {_stat(c('softirq'), 0)} | {_stat(c('steal'), 1)} | "
                     f"{_stat([d['cpu'].get('ksoftirqd_s') for d in ds], 2)} | "
                     f"{_stat(t('a', 'sender_cpu_percent'), 0)} | {_stat(t('b', 'sender_cpu_percent'), 0)} | "
                     f"{_stat(t('a', 'sent_bps', 1e6), 0)} / {_stat(t('a', 'goodput_bps', 1e6), 0)} | "
                     f"{_stat(t('b', 'sent_bps', 1e6), 0)} / {_stat(t('b', 'goodput_bps', 1e6), 0)} |")
    return "\n".join(lines)


@contextlib.contextmanager
def busy_loops(n: int, deadline_s: float):
    """*n* CPU-bound processes (``sh -c 'while :; do :; done'``) for the block: a busy day, reproducibly.

    Each in its own process group under ``timeout``; ended by process group id, also on error.
    """
    procs = [subprocess.Popen(["timeout", str(int(deadline_s)), "sh", "-c", "while :; do :; done"],
                              start_new_session=True) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def bed_check(single_mbit: list[float], link_mbit: float) -> str:
    """Whether the link, not the machine's CPU, bounded one unshaped tenant: only then do the figures measure a shaper."""
    if not single_mbit:
        return ""
    worst = min(single_mbit) / (link_mbit * 1448 / 1514)
    verdict = ("the link bounded it: the bed measures the shaper" if worst >= 0.95 else
               "below 95 %: the senders' CPU, not the link, bounded it in at least one round")
    return f"Bed check: the lowest of those is {100 * worst:.1f} % of the link's TCP payload rate ({verdict})."


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def sweep_table(by_cap: dict[float, list[list[dict]]]) -> str:
    lines = ["| shaperd node.capacity | worst guarantee % (sc. 3-5) | total goodput vs single tenant % | "
             "worst 1 s over limit % | wire TBF drops (sc. 3-5) | B ping p99 (sc. 7) |", "|---|---|---|---|---|---|"]
    for cap, rounds in by_cap.items():
        tg = [{t.target: t for t in report.targets(report.index(r), "shaperd")} for r in rounds]
        drops = []
        p99 = []
        for r in rounds:
            idx = report.index(r)
            drops.append(sum(idx[k].get("qdiscs", {}).get("wire", {}).get("drops", 0)
                             for k in ("together/shaperd", "pressure/shaperd", "udp/shaperd") if k in idx))
            lat = idx.get("latency/shaperd")
            p99.append(lat["extra"]["rtt"].get("p99_ms") if lat and not lat.get("error") else None)
        lines.append(f"| {cap / 1e6:g} Mbit/s | {_stat([x['guarantee'].value for x in tg])} | "
                     f"{_stat([x['utilisation'].value for x in tg])} | {_stat([x['limit'].value for x in tg])} | "
                     f"{_stat(drops, 0)} | {_stat(p99, 3, ' ms')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    ap.add_argument("--link", type=int, default=1000, help="emulated link, Mbit/s (default 1000)")
    ap.add_argument("--capacity", default="", help="shaperd node.capacity in Mbit/s; several, comma-separated, "
                    "sweep it (default: the link rate)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json-out", help="also write every raw result here")
    ap.add_argument("--flood-flows", type=int, default=Settings.flood_flows,
                    help=f"flows of the flooding tenant in pressure/converge/latency (default {Settings.flood_flows})")
    ap.add_argument("--victim-flows", type=int, default=Settings.victim_flows,
                    help=f"flows of the other tenant there (default {Settings.victim_flows})")
    ap.add_argument("--traffic-nice", type=int, default=None, metavar="N",
                    help="run every traffic process at nice N (e.g. -15): the bed, not other load, gets the CPU")
    ap.add_argument("--pin-senders", default="", metavar="CPUS",
                    help="pin tenant i's senders to the i-th CPU of this comma-separated list (e.g. 0,1)")
    ap.add_argument("--zerocopy", action="store_true",
                    help="TCP senders use sendfile (iperf3 -Z): less CPU per bit in the senders")
    ap.add_argument("--busy-loops", type=int, default=0, metavar="N",
                    help="keep N CPU-bound loops running for the whole run (a busy machine, reproducibly)")
    a = ap.parse_args(argv)
    problems = shaping.prerequisites()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 3
    scenarios = tuple(a.scenarios.split(","))
    modes = tuple(a.modes.split(","))
    if "shaperd" in modes and not shaping.shaperd_available():
        print("shaperd's CLI is not runnable; leaving the shaperd mode out", file=sys.stderr)
        modes = tuple(m for m in modes if m != "shaperd")
    caps = [float(x) * 1e6 for x in a.capacity.split(",") if x.strip()] or [None]
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    by_cap: dict = {}
    pins = tuple(int(x) for x in a.pin_senders.split(",") if x.strip())
    loads: list[str] = []
    with busy_loops(a.busy_loops, deadline_s=4 * 3600):
        for cap in caps:
            rounds = []
            for i in range(a.repeats):
                loads.append(loadavg())
                log(f"capacity {cap and cap / 1e6} round {i + 1}/{a.repeats} (load {loads[-1]})")
                # the sweep only changes shaperd's rows: run the others once per round at the first capacity
                m = modes if cap == caps[0] else tuple(x for x in modes if x in ("shaperd", "none"))
                st = Settings(duration=a.duration, capacity_bps=cap, flood_flows=a.flood_flows,
                              victim_flows=a.victim_flows)
                rounds.append(one_round(a.link, st, scenarios, m, log, traffic_nice=a.traffic_nice,
                                        sender_cpus=pins, zerocopy=a.zerocopy))
            by_cap[cap if cap else a.link * 1e6] = rounds
        loads.append(loadavg())
    shown = tuple(m for m in ("shaperd", "hand-tc") if m in modes)
    first = next(iter(by_cap.values()))
    cmd = " ".join(shlex.quote(x) for x in ["python3", "bench/isolation.py", *(argv if argv is not None else sys.argv[1:])])
    iperf = subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    alone = [report.index(r).get("alone/none") for r in first]
    single = [max(t["goodput_bps"] for t in d["tenants"].values()) / 1e6 for d in alone if d and not d.get("error")]
    out = [f"### Isolation on the namespace bed ({a.link} Mbit/s emulated link)", "",
           f"Reproduce (root): `{cmd}`  ",
           f"{a.repeats} round(s), {a.duration:g} s per measurement; {os.cpu_count()} cores, Linux "
           f"{platform.release()}, {iperf}. Figures are mean ± stdev (min..max) over rounds.  ",
           f"Single unshaped tenant through the bed: {_stat(single, 0)} Mbit/s goodput "
           f"({a.link} Mbit/s TBF; TCP payload is at most 1448/1514 = 95.6 % of it). {bed_check(single, a.link)}  ",
           f"Load average (1/5/15 min) at each round's start and at the end: {'; '.join(loads)}; "
           f"busy loops: {a.busy_loops}; traffic nice: {a.traffic_nice}; senders pinned: {a.pin_senders or 'no'}; "
           f"zerocopy senders: {'yes' if a.zerocopy else 'no'}.", "",
           "Source design's table (tenant % = goodput vs the same tenant alone unshaped; link % = goodput / link):", "",
           source_table(first, shown), "", "Targets (L2 rate as tc accounts it):", "", targets_table(first, shown), "",
           "Per scenario (G = guarantee, L = limit):", "", detail_table(first), "",
           "CPU in each scenario's last measurement (machine: % of all CPUs' time; senders: iperf3's own figure, "
           "% of one CPU):", "", cpu_table(first)]
    if len(by_cap) > 1:
        out += ["", "shaperd node.capacity vs the fixed link (headroom):", "", sweep_table(by_cap)]
    print("\n".join(out))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({str(k): v for k, v in by_cap.items()}, f, default=str)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
