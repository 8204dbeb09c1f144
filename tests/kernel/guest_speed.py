"""The guest's measured speed: calibrated once per boot, and every in-guest deadline scaled by it.

TCG's speed varies by 2x and more between machines of this kind and with their load, so a fixed
wall-clock deadline inside the guest breaks on a slow or busy one (issue 23: ``shaperd status``
killed at its fixed deadline). The guest runner (tests/kernel/guest_main.py) times two fixed
workloads once, right after boot: a pure-Python CPU loop and a fresh ``python -c 'import
shaperd.cli.main'`` (imports over the shared 9p filesystem dominate start-up under TCG). The
factor is the larger of the two ratios to their REFERENCE times (what a quiet 2-core machine of
this kind took in its guest), never below 1: the base deadlines written in the guest programs
are the quiet machine's, and they only ever grow. The runner exports the factor in
``SHAPERD_GUEST_SCALE``; guest programs call ``deadline(base_s)``.

A deadline here is a guard against a hang, not a measurement: a slower guest waits longer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ENV = "SHAPERD_GUEST_SCALE"
# The workloads' times in the guest on a quiet machine (the speed the base deadlines were written
# for), set low on purpose: a too-low reference only makes a hang guard longer. The 2026-12-02 runs are
# in BENCHMARKS.md "QEMU tier" (the host, quiet, is ~15x faster: TESTGROUND.md).
REFERENCE_CPU_S = 0.6
# The import workload is shaperd's own start-up, so it shrinks when the CLI imports less: the reference
# must shrink with it or the factor falls for a guest of the same speed and the deadlines with it. After
# the lean status imports (cli/main loads 172 modules instead of 315) a boot whose CPU loop took 0.264 s
# imported in 4.24 s, against 10.66 s at 0.274 s before (BENCHMARKS.md "QEMU tier"): 8.0 x 0.40 = 3.2,
# which gives that boot the factor the old import gave such a guest (1.33).
REFERENCE_IMPORT_S = 3.2
CPU_LOOPS = 300_000
MAX_FACTOR = 4.0  # past this the guest is too slow to be useful; the sum of the scaled deadlines fits the boot's


def cpu_workload(loops: int = CPU_LOOPS) -> float:
    """Seconds for a fixed pure-Python loop (interpreter speed: what TCG slows most)."""
    t = time.monotonic()
    acc = 0
    for i in range(loops):
        acc = (acc + i * i) % 1_000_003
    return time.monotonic() - t


def import_workload(timeout_s: float = 600.0) -> float:
    """Seconds for a fresh interpreter to import the CLI (start-up: imports over 9p), in its own group."""
    t = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", "import shaperd.cli.main"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.wait()
    return time.monotonic() - t


def calibrate() -> dict:
    """One calibration: the workloads' times, their ratios to the references, and the factor (1..MAX_FACTOR)."""
    cpu = min(cpu_workload() for _ in range(2))
    imp = import_workload()
    factor = min(MAX_FACTOR, max(1.0, cpu / REFERENCE_CPU_S, imp / REFERENCE_IMPORT_S))
    return {"cpu_s": round(cpu, 3), "import_s": round(imp, 3), "reference_cpu_s": REFERENCE_CPU_S,
            "reference_import_s": REFERENCE_IMPORT_S, "factor": round(factor, 3)}


def factor() -> float:
    """The factor the runner exported (1 outside a calibrated guest, e.g. on the host)."""
    try:
        return max(1.0, float(os.environ.get(ENV, "1")))
    except ValueError:
        return 1.0


def deadline(base_s: float) -> float:
    """A quiet machine's deadline, scaled by this guest's measured speed."""
    return base_s * factor()


if __name__ == "__main__":
    import json

    print(json.dumps(calibrate()))
