"""Runs inside the QEMU guest: calibrate the guest's speed once, then run every guest program of the boot.

``python -m tests.kernel.guest_main OUTDIR`` (as root in the guest) times the calibration
workloads (tests/kernel/guest_speed.py), exports the factor in ``SHAPERD_GUEST_SCALE`` and runs
each program of ``vm.GUEST_PROGRAMS`` in turn as ``python -m MODULE OUTDIR``, each in its own
process group with its base deadline times the factor (killed by group id when it is hit). Each
program writes its own JSON result into OUTDIR; this runner writes OUTDIR/runner.json after
the calibration and after every program, so when the host's outer deadline kills the boot the
host can say how far the guest got. It asserts nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from . import guest_speed, vm
from .guest_probe import run


def main(outdir: str) -> int:
    out_dir = Path(outdir)
    t0 = time.monotonic()
    doc: dict = {"uname": os.uname().release, "programs": {}, "done": []}
    path = out_dir / vm.RUNNER_JSON

    def save(now: str) -> None:
        doc["now"], doc["elapsed_s"] = now, round(time.monotonic() - t0, 1)
        path.write_text(json.dumps(doc, indent=1, sort_keys=True))

    save("calibrating")
    doc["calibration"] = cal = guest_speed.calibrate()
    os.environ[guest_speed.ENV] = str(cal["factor"])  # inherited by every program and its helpers
    for prog in vm.GUEST_PROGRAMS:
        save(f"running {prog.name} (deadline {prog.deadline_s * cal['factor']:.0f} s)")
        start = time.monotonic()
        step = run([sys.executable, "-m", prog.module, str(out_dir)], timeout_s=prog.deadline_s * cal["factor"])
        step["seconds"] = round(time.monotonic() - start, 1)
        step["stdout"], step["stderr"] = step["stdout"][-4000:], step["stderr"][-4000:]
        doc["programs"][prog.name] = step
        doc["done"].append(prog.name)
    save("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
