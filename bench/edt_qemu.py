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

``--pod-caps``: instead, the per-pod cap scenario (tests/kernel/edt_pods_guest.py), repeated: in gold, a pod
capped at 8 Mbit/s (a fifth of the 40) and an uncapped tenant-mate send for 3 s, then bronze wakes for 4 s;
how close the capped pod is to its cap, what the mate borrows, and the isolation targets with the pod in
place; and the stamper's cost per packet of a tenant and of a capped pod (BPF_PROG_TEST_RUN in the guest).

    .venv/bin/python bench/edt_qemu.py --pod-caps --repeats 3
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


POD_TARGETS = {  # key -> (what it is, target)
    "cap_ratio_alone": ("capped pod / its cap, mate sending", "0.90..1.03"),
    "mate_alone_mbit": ("mate, Mbit/s (borrows what the cap leaves)", ">= 0.9 x (40 - 8)"),
    "utilisation_alone": ("pods together / capacity", ">= 0.95"),
    "cap_ratio_both": ("capped pod / its cap, bronze sending too", "0.90..1.03"),
    "guarantee_gold": ("gold (pod + mate) / its guarantee", ">= 0.98"),
    "guarantee_bronze": ("bronze / its guarantee", ">= 0.98"),
    "utilisation": ("all / capacity", ">= 0.95"),
}


def pod_table(result: dict, repeats: int) -> str:
    lines = ["| metric | target | edt, median (range, n) |", "|---|---|---|"]
    for key, (what, target) in POD_TARGETS.items():
        lines.append(f"| {what} | {target} | "
                     f"{_cell([result.get(f'pod_caps_{r}', {}).get(key) for r in range(repeats)])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pod-caps", action="store_true", help="the per-pod cap scenario instead (edt_pods_guest)")
    args = ap.parse_args(argv)
    host_load_before = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="shaperd-edt-bench-") as tmp:
        out = Path(tmp)
        run = vm.boot([sys.executable, "-m", "tests.kernel.edt_guest", str(out), "--bench", "--repeats",
                       str(args.repeats), *(["--pod-caps"] if args.pod_caps else [])], [out], deadline_s=1800)
        path = out / "edt.json"
        if not path.exists():
            print(run.output[-4000:], file=sys.stderr)
            print(f"the guest wrote no result (rc {run.rc}, {run.seconds:.0f} s)", file=sys.stderr)
            return 1
        result = json.loads(path.read_text())
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))
    cal = result.get("calibration") or {}
    print(f"guest speed: cpu loop {cal.get('cpu_s')} s, CLI import {cal.get('import_s')} s, deadline factor "
          f"{cal.get('factor')} (tests/kernel/guest_speed.py)")
    print(f"kernel {result['uname']} under TCG, guest run {run.seconds:.0f} s; host load before "
          f"{host_load_before}, after {Path('/proc/loadavg').read_text().strip()}; guest load {result['loadavg']}")
    print(f"stamper: {result['cases']['insns']} instructions, {result['cases']['ns_per_run']} ns per "
          f"BPF_PROG_TEST_RUN repetition of a tenant's packet, {result['cases'].get('ns_per_run_pod')} ns of a "
          "capped pod's (TCG)")
    if result.get("errors"):
        print("errors:", json.dumps(result["errors"], indent=1)[:3000])
    print(pod_table(result, args.repeats) if args.pod_caps else table(result, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
