"""The real-kernel tier: one QEMU guest (Debian's kernel, rdma_rxe) booted once for the whole session.

Every test here reads the result of that one boot (tests/kernel/vm.py runs
every program of vm.GUEST_PROGRAMS in the guest, through tests/kernel/guest_main.py,
with deadlines scaled by the guest's measured speed), so the tier costs one boot. Without root the tier is skipped with a reason;
as root, a missing qemu, kernel image, busybox or virtme-ng is a failure
(scripts/setup installs them), so CI can never skip it silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from . import vm


@dataclass(frozen=True)
class Guest:
    run: vm.GuestRun
    result: dict

    def step(self, name: str) -> dict:
        return self.result["steps"][name]


@pytest.fixture(scope="session")
def guest(tmp_path_factory) -> Guest:
    if os.geteuid() != 0:
        pytest.skip("the QEMU tier runs the guest as root (modprobe, rdma link add): run the tests as root")
    try:
        vm.check_tools()
    except vm.VmUnavailable as e:
        pytest.fail(f"QEMU tier cannot run: {e}", pytrace=False)
    out = tmp_path_factory.mktemp("rxe-guest")
    run, result = vm.probe(out)
    print(f"\nQEMU guest: kernel {run.kernel}, rc {run.rc}, {run.seconds:.0f} s")
    cal = result.get("calibration") if result else None
    if cal:
        print(f"QEMU guest speed: cpu {cal['cpu_s']} s, import {cal['import_s']} s, deadline factor {cal['factor']}")
    if result is None:
        pytest.fail(f"the guest wrote no result (rc {run.rc} after {run.seconds:.0f} s; None = killed at the "
                    f"{vm.BOOT_DEADLINE_S:.0f} s deadline); {vm.progress(out)}. Its console:\n{run.output[-4000:]}",
                    pytrace=False)
    return Guest(run, result)
