#!/usr/bin/env python3
"""Eight tenants benchmark: each gets its guarantee on a full link, unshaped against shaperd, repeated.

Builds the bed (``shaperd_bed``, testbed/) with the eight tenants of ``shaperd_bed.many``
(guarantees 5-20 % summing to 90 %, limits open, priorities 10-100, 1-8 flows each) and, per
round: one tenant alone unshaped (the utilisation reference), all eight unshaped, all eight under
shaperd. Prints markdown for BENCHMARKS.md: per tenant its attainment (steady wire rate /
guarantee), the worst attainment, the link's utilisation and where the CPU went, with the load
average and the command. The targets are the isolation benchmark's: every tenant >= 98 % of its
guarantee; the link >= 95 % of a single unshaped tenant's goodput.

    sudo .venv/bin/python bench/many_tenants.py --link 5000 --repeats 3 --duration 8 [--busy-loops 2]
        [--traffic-nice -15] [--zerocopy] [--json-out F]

Needs root, iproute2, iperf3 and the bed installed (scripts/setup). About 40 s per round.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from isolation import _stat, busy_loops, loadavg  # noqa: E402
from shaperd_bed import many, shaping  # noqa: E402
from shaperd_bed.topology import Bed, BedConfig  # noqa: E402

GUARANTEE_TARGET = 0.98
UTILISATION_TARGET = 0.95


def one_round(a, log) -> dict:
    cfg = BedConfig(link_mbit=a.link, tenants=many.eight_tenants(), traffic_nice=a.traffic_nice,
                    sender_zerocopy=a.zerocopy)
    with Bed(cfg) as bed:
        log(f"bed {bed.run_id}: alone")
        single = many.single_unshaped(bed, a.duration)
        out = {"single_goodput_bps": single}
        for mode in ("none", "shaperd"):
            log(f"eight [{mode}]")
            out[mode] = many.run(bed, mode, duration_s=a.duration, capacity_bps=a.capacity * 1e6 if a.capacity
                                 else None).to_dict()
    return out


def tables(rounds: list[dict]) -> str:
    shorts = list(rounds[0]["shaperd"]["tenants"])
    lines = ["| tenant | guarantee Mbit/s | priority | flows | unshaped: wire Mbit/s (% of G) | "
             "shaperd: wire Mbit/s | shaperd: % of G | shaperd: sent Mbit/s | sender CPU % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k in shorts:
        t0 = rounds[0]["shaperd"]["tenants"][k]
        none_w = [r["none"]["tenants"][k]["wire_bps"] / 1e6 for r in rounds]
        none_a = [100 * r["none"]["tenants"][k]["attainment"] for r in rounds]
        sh = [r["shaperd"]["tenants"][k] for r in rounds]
        lines.append(f"| {k} | {t0['guarantee_bps'] / 1e6:g} | {t0['priority']} | {t0['flows']} | "
                     f"{_stat(none_w, 0)} ({_stat(none_a, 0)}) | {_stat([t['wire_bps'] / 1e6 for t in sh], 0)} | "
                     f"{_stat([100 * t['attainment'] for t in sh], 1)} | "
                     f"{_stat([t['sent_bps'] / 1e6 for t in sh], 0)} | "
                     f"{_stat([t['sender_cpu_percent'] for t in sh], 0)} |")
    return "\n".join(lines)


def targets(rounds: list[dict]) -> tuple[str, bool]:
    worst = [r["shaperd"]["worst"] for r in rounds]
    util = [r["shaperd"]["total_goodput_bps"] / r["single_goodput_bps"] for r in rounds]
    none_worst = [r["none"]["worst"] for r in rounds]
    ok_g = [w[1] >= GUARANTEE_TARGET for w in worst]
    ok_u = [u >= UTILISATION_TARGET for u in util]

    def verdict(oks):
        return "ok" if all(oks) else f"MISSED {oks.count(False)}/{len(oks)}"

    lines = ["| target | unshaped | shaperd |", "|---|---|---|",
             f"| every tenant >= {GUARANTEE_TARGET:.0%} of its guarantee (worst attainment, tenant) | "
             f"{_stat([100 * w[1] for w in none_worst], 1, ' %')} ({', '.join(w[0] for w in none_worst)}) | "
             f"{_stat([100 * w[1] for w in worst], 1, ' %')} ({', '.join(w[0] for w in worst)}) {verdict(ok_g)} |",
             f"| link >= {UTILISATION_TARGET:.0%} of a single unshaped tenant's goodput | "
             f"{_stat([100 * r['none']['total_goodput_bps'] / r['single_goodput_bps'] for r in rounds], 1, ' %')} | "
             f"{_stat([100 * u for u in util], 1, ' %')} {verdict(ok_u)} |"]
    return "\n".join(lines), all(ok_g) and all(ok_u)


def cpu_line(rounds: list[dict]) -> str:
    def c(mode, f):
        return [r[mode]["cpu"].get("cpu", {}).get(f) for r in rounds]

    return ("CPU while all eight sent (machine, % of both CPUs' time): unshaped busy "
            f"{_stat(c('none', 'busy'), 0)} %, softirq {_stat(c('none', 'softirq'), 0)} %; shaperd busy "
            f"{_stat(c('shaperd', 'busy'), 0)} %, softirq {_stat(c('shaperd', 'softirq'), 0)} %, steal "
            f"{_stat(c('shaperd', 'steal'), 1)} %, ksoftirqd "
            f"{_stat([r['shaperd']['cpu'].get('ksoftirqd_s') for r in rounds], 2)} s; uplink drops under shaperd "
            f"{_stat([r['shaperd']['uplink_drops'] for r in rounds], 0)}, in the wire's TBF "
            f"{_stat([r['shaperd'].get('wire_drops') for r in rounds], 0)}.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link", type=int, default=5000, help="emulated link, Mbit/s (default 5000)")
    ap.add_argument("--capacity", type=float, default=None, help="shaperd node.capacity, Mbit/s (default: the link)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    ap.add_argument("--traffic-nice", type=int, default=None, metavar="N",
                    help="run every traffic process at nice N (e.g. -15)")
    ap.add_argument("--zerocopy", action="store_true", help="TCP senders use sendfile (iperf3 -Z)")
    ap.add_argument("--busy-loops", type=int, default=0, metavar="N", help="keep N CPU-bound loops running")
    ap.add_argument("--json-out", help="also write every raw result here")
    a = ap.parse_args(argv)
    problems = shaping.prerequisites()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 3
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    rounds, loads = [], []
    with busy_loops(a.busy_loops, deadline_s=4 * 3600):
        for i in range(a.repeats):
            loads.append(loadavg())
            log(f"round {i + 1}/{a.repeats} (load {loads[-1]})")
            rounds.append(one_round(a, log))
        loads.append(loadavg())
    cmd = " ".join(shlex.quote(x) for x in ["python3", "bench/many_tenants.py", *(argv if argv is not None
                                                                                  else sys.argv[1:])])
    iperf = subprocess.run(["iperf3", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    tgt, _ = targets(rounds)
    single = [r["single_goodput_bps"] / 1e6 for r in rounds]
    print("\n".join([
        f"### Eight tenants on the namespace bed ({a.link} Mbit/s emulated link)", "",
        f"Reproduce (root): `{cmd}`  ",
        f"{a.repeats} round(s), {a.duration:g} s per measurement; {os.cpu_count()} cores, Linux {platform.release()}, "
        f"{iperf}. Figures are mean ± stdev (min..max) over rounds.  ",
        f"The wire alone (one tenant, 8 flows, unshaped): {_stat(single, 0)} Mbit/s goodput.  ",
        f"Load average at each round's start and at the end: {'; '.join(loads)}; busy loops: {a.busy_loops}; "
        f"traffic nice: {a.traffic_nice}; zerocopy senders: {'yes' if a.zerocopy else 'no'}.", "", tgt, "", tables(rounds), "", cpu_line(rounds)]))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rounds, f, default=str)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
