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
``--summary`` prints per class the deltas over the run, the largest backlog and the lowest tokens.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=0.25)
    ap.add_argument("--deadline", type=float, default=900.0)
    ap.add_argument("--summary", action="store_true", help="print the summary of an existing --out file")
    args = ap.parse_args(argv)
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
