#!/usr/bin/env python3
"""edt vs htb in the QEMU tier (Debian's kernel): isolation targets and CPU per packet, on one bed and kernel.

Boots one guest (tests/kernel/vm.py) that runs ``tests.kernel.edt_guest --bench --repeats N``:
per data plane and repeat a fresh bed (veth, 4 TX queues, 40 Mbit/s shaped
capacity), bronze alone (limit 50 %), then gold wakes (guarantee 60 %, higher
priority); then CPU per packet with 1, 2, 4 senders of 64-byte datagrams.
Prints markdown for BENCHMARKS.md (median and range over the repeats), and
the host's and guest's load. Needs root, qemu, a Debian kernel under /boot,
virtme-ng (scripts/setup installs them).

    .venv/bin/python bench/edt_qemu.py --repeats 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel import vm  # noqa: E402

TARGETS = {"guarantee_gold": ">= 0.98", "guarantee_bronze": ">= 0.98", "limit_excess_bronze": "<= 0.03",
           "utilisation": ">= 0.95", "convergence_s": "< 1"}


def _cell(vals: list) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    med = statistics.median(vals)
    return f"{med:.3f} ({min(vals):.3f}..{max(vals):.3f}, n={len(vals)})"


def table(result: dict, repeats: int) -> str:
    lines = ["| metric | target | edt | htb |", "|---|---|---|---|"]
    for key, target in TARGETS.items():
        cells = []
        for dp in ("edt", "htb"):
            cells.append(_cell([result.get(f"isolation_{dp}_{r}", {}).get(key) for r in range(repeats)]))
        lines.append(f"| {key} | {target} | {cells[0]} | {cells[1]} |")
    lines += ["", "| senders | edt µs/packet received (sent) | htb µs/packet received (sent) | edt received / sent "
              "| htb received / sent |", "|---|---|---|---|---|"]
    rows = [(f"{n}", f"cpu_edt_{n}", f"cpu_htb_{n}") for n in (1, 2, 4)]
    rows += [(f"{n}, capacity 10 Gbit/s", f"cpufast_edt_{n}", f"cpufast_htb_{n}") for n in (1, 2, 4)]
    for n, ek, hk in rows:
        e, h = result.get(ek, {}), result.get(hk, {})

        def fmt(c):
            if not c.get("us_per_packet"):
                return "-"
            return f"{c['us_per_packet']:.1f} ({c.get('us_per_sent_packet') or 0:.1f})"

        def counts(c):
            return f"{c.get('packets', '-')} / {sum(c.get('sent', []))}"

        lines.append(f"| {n} | {fmt(e)} | {fmt(h)} | {counts(e)} | {counts(h)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    host_load_before = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="shaperd-edt-bench-") as tmp:
        out = Path(tmp)
        run = vm.boot([sys.executable, "-m", "tests.kernel.edt_guest", str(out), "--bench", "--repeats",
                       str(args.repeats)], [out], deadline_s=1800)
        path = out / "edt.json"
        if not path.exists():
            print(run.output[-4000:], file=sys.stderr)
            print(f"the guest wrote no result (rc {run.rc}, {run.seconds:.0f} s)", file=sys.stderr)
            return 1
        result = json.loads(path.read_text())
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"kernel {result['uname']} under TCG, guest run {run.seconds:.0f} s; host load before "
          f"{host_load_before}, after {Path('/proc/loadavg').read_text().strip()}; guest load {result['loadavg']}")
    print(f"stamper: {result['cases']['insns']} instructions, {result['cases']['ns_per_run']} ns per "
          "BPF_PROG_TEST_RUN repetition (TCG)")
    if result.get("errors"):
        print("errors:", json.dumps(result["errors"], indent=1)[:3000])
    print(table(result, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
