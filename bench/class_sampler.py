#!/usr/bin/env python3
"""Sample the HTB classes and leaf qdiscs of the isolation bed's uplink while a benchmark runs.

    sudo .venv/bin/python bench/class_sampler.py --out /tmp/classes.jsonl [--every 0.25] [--deadline 900] &
    sudo .venv/bin/python bench/isolation.py --link 10000 --scenarios pressure --modes shaperd ...

Owns: waiting for the bed's node namespace (``shb-*-node``, testbed/shaperd_bed/topology.py), then
reading its uplink's (``up-*``) HTB classes and qdiscs through shaperd's own netlink reader
(kernel/rtnl.RtnlReader: one socket per bed, no process per sample) every ``--every`` seconds, and
the next bed's after it goes, until the deadline; one JSON line per sample (with its ``ns``): per
class its bytes, packets, drops, overlimits, backlog, qlen, lended, borrowed, tokens and ctokens;
per qdisc its drops, overlimits, backlog and qlen.
``--summary`` prints per class the deltas over the run, the largest backlog and the lowest tokens;
``--per-scenario RESULTS`` (bench/isolation.py's ``--json-out``) cuts the samples at each scenario's
start and end and prints per scenario, mode and tenant class: the kernel-counted rate and its
highest 1 s window, drops, overlimits, the largest and mean backlog and the share of samples with
one. A class with no backlog was not held back by the shaper: what it sent was all its sender
offered.
Must not: write to the kernel. Each read has the reader's deadline; nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _bed_ns(run_netns: str = "/run/netns") -> str | None:
    try:
        names = sorted(os.listdir(run_netns))
    except OSError:
        return None
    return next((n for n in names if n.startswith("shb-") and n.endswith("-node")), None)


def _handle(h: int) -> str:
    return f"{h >> 16:x}:{h & 0xFFFF:x}"


def sample(reader, ifindex: int, dev: str) -> dict:
    classes = [{"handle": _handle(c.classid), "parent": _handle(c.parent), "bytes": c.bytes, "packets": c.packets,
                "drops": c.drops, "overlimits": c.overlimits, "backlog": c.backlog_bytes, "qlen": c.qlen,
                "lended": c.lends, "borrowed": c.borrows, "tokens": c.tokens, "ctokens": c.ctokens}
               for c in reader.htb_classes(ifindex, dev)]
    qdiscs = [{"handle": _handle(q.handle), "kind": q.kind, "parent": _handle(q.parent),
               **({"drops": q.counters.drops, "overlimits": q.counters.overlimits,
                   "backlog": q.counters.backlog_bytes, "qlen": q.counters.qlen} if q.counters else {})}
              for q in reader.qdiscs(ifindex, dev)]
    return {"t": time.monotonic(), "classes": classes, "qdiscs": qdiscs}


def summary(path: str) -> None:
    """Per bed (one namespace each) and class: deltas over its samples, largest backlog, lowest tokens."""
    rows = [json.loads(ln) for ln in open(path) if ln.strip()]
    beds: dict[str, list[dict]] = {}
    for r in rows:
        if r["classes"]:
            beds.setdefault(r.get("ns", "?"), []).append(r)
    if not beds:
        print("no samples")
        return
    print("| bed | class | bytes | drops | overlimits | max backlog (B) | max qlen | min tokens | min ctokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ns, rs in beds.items():
        by: dict[str, list[dict]] = {}
        for r in rs:
            for c in r["classes"]:
                by.setdefault(c["handle"], []).append(c)
        for h, cs in sorted(by.items()):
            d = lambda k: (cs[-1].get(k) or 0) - (cs[0].get(k) or 0)  # noqa: E731
            print(f"| {ns} ({len(rs)} samples, {rs[-1]['t'] - rs[0]['t']:.0f} s) | {h} | {d('bytes'):,} | "
                  f"{d('drops'):,} | {d('overlimits'):,} | {max(c.get('backlog') or 0 for c in cs):,} | "
                  f"{max(c.get('qlen') or 0 for c in cs)} | {min(c.get('tokens') or 0 for c in cs):,} | "
                  f"{min(c.get('ctokens') or 0 for c in cs):,} |")


def _load(path: str) -> list[dict]:
    return [json.loads(ln) for ln in open(path) if ln.strip()]


def windows(results: dict) -> list[tuple[int, dict, float, float]]:
    """(round, result, start, end) per scenario result, in monotonic seconds (the sampler's clock).

    Results without ``started_monotonic`` (bench runs before it was recorded) are left out: placing
    them by elapsed times alone misses the gaps between scenarios.
    """
    rounds = [rd for per_cap in results.values() for rd in per_cap]
    return [(i, d, d["started_monotonic"], d["started_monotonic"] + d.get("elapsed_s", 0.0))
            for i, rd in enumerate(rounds) for d in rd if d.get("started_monotonic")]


def _last_tree(cs: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
    """The samples since the class was last created: a scenario replaces the tree, counters restart."""
    start = 0
    for j in range(1, len(cs)):
        if (cs[j][1].get("bytes") or 0) < (cs[j - 1][1].get("bytes") or 0):
            start = j
    return cs[start:]


def per_scenario(results_path: str, path: str, names: tuple[str, ...] = ("tenant-a", "tenant-b")) -> None:
    from shaperd.core.ids import assign_minors

    label = {f"7368:{m:x}": n for n, m in assign_minors(list(names)).items()}
    rows = [r for r in _load(path) if r["classes"]]
    with open(results_path) as f:
        results = json.load(f)
    print("| round | scenario | mode | class | Mbit/s (kernel) | max 1 s Mbit/s | over its limit % | drops | "
          "overlimits | max backlog (B) | mean backlog (B) | samples with backlog |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst: tuple[float, str] | None = None
    for i, d, t0, t1 in windows(results):
        sel = [r for r in rows if t0 <= r["t"] <= t1]
        if len(sel) < 2:
            continue
        for handle, name in sorted(label.items(), key=lambda kv: kv[1]):
            cs = [(r["t"], next((c for c in r["classes"] if c["handle"] == handle), None)) for r in sel]
            cs = _last_tree([(t, c) for t, c in cs if c is not None])
            if len(cs) < 2:
                continue
            span = cs[-1][0] - cs[0][0]
            rate = 8 * (cs[-1][1]["bytes"] - cs[0][1]["bytes"]) / span / 1e6 if span > 0 else 0.0
            best = 0.0
            for j, (tj, cj) in enumerate(cs):
                k = next((k for k in range(j + 1, len(cs)) if cs[k][0] - tj >= 1.0), None)
                if k is not None:
                    best = max(best, 8 * (cs[k][1]["bytes"] - cj["bytes"]) / (cs[k][0] - tj) / 1e6)
            backlogs = [c.get("backlog") or 0 for _, c in cs]
            d_ = lambda key: (cs[-1][1].get(key) or 0) - (cs[0][1].get(key) or 0)  # noqa: E731
            # the class counts frames as tc does (L2), the unit of the tenant's limit in the results
            limit = ((d.get("tenants") or {}).get(name.rsplit("-", 1)[-1]) or {}).get("limit_bps")
            over = 100.0 * (best * 1e6 / limit - 1.0) if limit and best else None
            if over is not None and (worst is None or over > worst[0]):
                worst = (over, f"round {i + 1}, {d['scenario']}, {name}")
            print(f"| {i + 1} | {d['scenario']} | {d['mode']} | {name} | {rate:,.0f} | {best:,.0f} | "
                  f"{'-' if over is None else f'{over:.1f}'} | {d_('drops'):,} | "
                  f"{d_('overlimits'):,} | {max(backlogs):,} | {sum(backlogs) / len(backlogs):,.0f} | "
                  f"{sum(1 for b in backlogs if b) }/{len(backlogs)} |")
    if worst is not None:
        print(f"\nHighest 1 s window over a limit, as the class counted it: {worst[0]:.1f} % ({worst[1]}).")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=0.25)
    ap.add_argument("--deadline", type=float, default=900.0)
    ap.add_argument("--summary", action="store_true", help="print the summary of an existing --out file")
    ap.add_argument("--per-scenario", metavar="RESULTS", help="bench/isolation.py's --json-out: print the "
                    "--out file's samples per scenario, mode and tenant class")
    args = ap.parse_args(argv)
    if args.per_scenario:
        per_scenario(args.per_scenario, args.out)
        return 0
    if args.summary:
        summary(args.out)
        return 0
    from shaperd.core.errors import ShaperdError
    from shaperd.kernel.rtnl import RtnlReader

    end = time.monotonic() + args.deadline
    with open(args.out, "w") as f:
        while time.monotonic() < end:
            ns = _bed_ns()
            if ns is None:
                time.sleep(0.2)
                continue
            try:
                with RtnlReader(ns) as reader:
                    while time.monotonic() < end:
                        up = next((ln for ln in reader.links() if ln.name.startswith("up-")), None)
                        if up is not None:
                            f.write(json.dumps({"ns": ns, **sample(reader, up.ifindex, up.name)}) + "\n")
                            f.flush()
                        time.sleep(args.every)
                        if _bed_ns() != ns:  # the bed is gone: wait for the next one (a repeat builds a new bed)
                            break
            except (ShaperdError, OSError):  # the namespace went between two reads
                time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
