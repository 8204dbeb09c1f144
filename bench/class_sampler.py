#!/usr/bin/env python3
"""Sample the HTB classes and leaf qdiscs of the isolation bed's uplink while a benchmark runs.

    sudo .venv/bin/python bench/class_sampler.py --out /tmp/classes.jsonl [--every 0.25] [--deadline 900] &
    sudo .venv/bin/python bench/isolation.py --link 10000 --scenarios pressure --modes shaperd ...

Owns: waiting for the bed's node namespace (``shb-*-node``, testbed/shaperd_bed/topology.py), then
reading ``tc -s class show`` and ``tc -s qdisc show`` of its uplink (``up-*``) every ``--every``
seconds, and the next bed's after it goes, until the deadline, one JSON line per sample (its ``ns``): per class its
bytes, packets, drops, overlimits, backlog, qlen, tokens and ctokens; per leaf qdisc its drops,
overlimits and backlog.
``--summary`` prints per class the deltas over the run, the largest backlog and the lowest tokens.
Must not: write to the kernel. Each tc call has a deadline; nothing is left running.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time


def _tc(ns: str, *args: str) -> str:
    # Text, not -j: iproute2 6.1 prints HTB's class stats as text even with -j.
    r = subprocess.run(["tc", "-n", ns, "-s", *args], capture_output=True, text=True, timeout=5)
    return r.stdout if r.returncode == 0 else ""


_HEAD = re.compile(r"^(class|qdisc) (\S+) (\S+)(?: dev \S+)?(?: (?:parent (\S+)|root))?")
_SENT = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")
_BACKLOG = re.compile(r"backlog (\d+)b (\d+)p")
_LENT = re.compile(r"lended: (\d+) borrowed: (\d+) giants: (\d+)")
_TOKENS = re.compile(r"tokens: (-?\d+) ctokens: (-?\d+)")


def parse_stats(text: str) -> list[dict]:
    """``tc -s class|qdisc show`` text as one dict per object (the fields this sampler keeps)."""
    out: list[dict] = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if m:
            out.append({"kind": m.group(2), "handle": m.group(3), "parent": m.group(4)})
            continue
        if not out:
            continue
        cur = out[-1]
        for rx, keys in ((_SENT, ("bytes", "packets", "drops", "overlimits")), (_BACKLOG, ("backlog", "qlen")),
                         (_LENT, ("lended", "borrowed", "giants")), (_TOKENS, ("tokens", "ctokens"))):
            m = rx.search(line)
            if m:
                cur.update(zip(keys, map(int, m.groups())))
    return out


def _bed_ns() -> str | None:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=5)
    names = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
    return next((n for n in names if n.startswith("shb-") and n.endswith("-node")), None)


def _uplink(ns: str) -> str | None:
    r = subprocess.run(["ip", "-n", ns, "-j", "link", "show"], capture_output=True, text=True, timeout=5)
    links = json.loads(r.stdout or "[]")
    return next((ln["ifname"] for ln in links if ln.get("ifname", "").startswith("up-")), None)


def sample(ns: str, dev: str) -> dict:
    classes = parse_stats(_tc(ns, "class", "show", "dev", dev))
    qdiscs = parse_stats(_tc(ns, "qdisc", "show", "dev", dev))
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
    end = time.monotonic() + args.deadline
    ns = dev = None
    with open(args.out, "w") as f:
        while time.monotonic() < end:
            if ns is None:
                ns = _bed_ns()
                if ns is None:
                    time.sleep(0.2)
                    continue
            try:
                dev = dev or _uplink(ns)
                if dev is None:
                    time.sleep(0.2)
                    continue
                f.write(json.dumps({"ns": ns, **sample(ns, dev)}) + "\n")
                f.flush()
            except (subprocess.TimeoutExpired, ValueError):
                pass
            if _bed_ns() != ns:  # the bed is gone: wait for the next one (a repeat builds a new bed)
                ns = dev = None
            time.sleep(args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
