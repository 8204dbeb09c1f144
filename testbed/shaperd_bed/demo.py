"""``shaperd demo``: build the bed, run the scenarios, print the table, clean up.

Wiring (in shaperd's CLI)::

    p = sub.add_parser("demo", help=...)
    demo.add_arguments(p)
    p.set_defaults(fn=lambda args: demo.run(args))

Needs root, iproute2, iperf3 and ping; fails with a clear message otherwise.
Everything it creates (namespaces, veths, processes, temp files) is removed on
normal exit, on errors, on Ctrl-C and on SIGTERM/SIGHUP.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import report, shaping
from .scenarios import MODES, SCENARIOS, Settings, run_all
from .topology import Bed, BedConfig, BedInterrupted

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PREREQ = 3


def _rate_mbit(text: str) -> float:
    """'1Gbps' / '950Mbps' / '950' (Mbit/s) -> Mbit/s."""
    t = text.strip()
    for unit, mult in (("Gbps", 1000.0), ("Mbps", 1.0), ("Kbps", 1e-3), ("bps", 1e-6)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult
    return float(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--link", default="1000", metavar="RATE",
                        help="emulated NIC capacity (the wire's TBF), e.g. 1Gbps or 1000 (Mbit/s); default 1000")
    parser.add_argument("--capacity", default=None, metavar="RATE",
                        help="node.capacity written to shaperd's tenants file (default: 99%% of the link rate, "
                             "so queues form in shaperd's classes, not in the shared NIC; see BENCHMARKS.md)")
    parser.add_argument("--duration", type=float, default=3.0, metavar="SECONDS",
                        help="seconds of traffic per measurement (default 3; about a minute in all)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated subset of none,shaperd,hand-tc (hand-tc = operator baseline)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _csv(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad:
        raise ValueError(f"unknown {what}: {', '.join(bad)} (expected some of {', '.join(allowed)})")
    return items


DEMO_HEADROOM = 0.99


def run(args: argparse.Namespace) -> int:
    err = sys.stderr
    problems = shaping.prerequisites()
    if problems:
        for p in problems:
            print(f"shaperd demo: {p}", file=err)
        return EXIT_PREREQ
    try:
        link_mbit = _rate_mbit(getattr(args, "link", "1000"))
        cap = getattr(args, "capacity", None)
        # 1 % headroom below the emulated NIC: measured best (bench/isolation.py --capacity sweep).
        capacity_bps = _rate_mbit(cap) * 1e6 if cap else link_mbit * 1e6 * DEMO_HEADROOM
        scenarios = _csv(getattr(args, "scenarios", ",".join(SCENARIOS)), SCENARIOS, "scenario")
        modes = _csv(getattr(args, "modes", ",".join(MODES)), MODES, "mode")
    except ValueError as e:
        print(f"shaperd demo: {e}", file=err)
        return 2
    if "none" not in modes and "alone" in scenarios:
        # the table's percentages are relative to each tenant alone, unshaped
        modes = ("none", *modes)
    quiet = getattr(args, "quiet", False)
    notes = []
    if "shaperd" in modes and not shaping.shaperd_available():
        notes.append("shaperd's CLI is not runnable (python -m shaperd --help failed): shaperd rows skipped")
        modes = tuple(m for m in modes if m != "shaperd")
    settings = Settings(duration=getattr(args, "duration", 3.0), capacity_bps=capacity_bps)

    def progress(msg: str) -> None:
        if not quiet:
            print(f"[demo {time.monotonic() - t0:5.1f}s] {msg}", file=err, flush=True)

    t0 = time.monotonic()
    bed = Bed(BedConfig(link_mbit=int(round(link_mbit))))
    try:
        with bed:
            progress(f"bed {bed.run_id} built: {link_mbit:g} Mbit/s wire, namespaces {', '.join(bed.namespaces())}")
            results = run_all(bed, settings, scenarios=scenarios, modes=modes, progress=progress)
            progress("tearing down")
    except KeyboardInterrupt:
        print("shaperd demo: interrupted; bed removed", file=err)
        return 130
    except BedInterrupted as e:
        print(f"shaperd demo: stopped by signal {e.signum}; bed removed", file=err)
        return 128 + e.signum
    left = bed.leftovers()
    if any(left.values()):
        notes.append(f"teardown left something behind: {left}")
    shown_modes = tuple(m for m in ("shaperd", "hand-tc") if m in modes)
    if getattr(args, "json", False):
        doc = report.to_json(results, link_mbit=link_mbit, run_id=bed.run_id,
                             settings=settings.__dict__, notes=notes, elapsed_s=time.monotonic() - t0)
        json.dump(doc, sys.stdout, indent=1, default=str)
        print()
    else:
        print(report.render(results, link_mbit=link_mbit, modes=shown_modes or ("shaperd", "hand-tc")), end="")
        for n in notes:
            print(f"note: {n}")
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"shaperd demo: {r.key}: {r.error}", file=err)
    return EXIT_FAILED if failed or any(left.values()) else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m shaperd_bed.demo`` (the same as ``shaperd demo``)."""
    ap = argparse.ArgumentParser(prog="shaperd demo", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
