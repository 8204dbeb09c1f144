"""shaperd/kernel/bpf.py raise_memlock: RLIMIT_MEMLOCK raised before the first bpf() on kernels < 5.11 only."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from shaperd.kernel import bpf


class FakePrlimit:
    def __init__(self, soft, hard, refuse_above_hard=True):
        self.limit, self.calls = (soft, hard), []
        self.refuse = refuse_above_hard

    def __call__(self, pid, res, new=None):
        assert pid == 0 and res == resource.RLIMIT_MEMLOCK
        if new is None:
            return self.limit
        self.calls.append(new)
        inf = resource.RLIM_INFINITY
        if self.refuse and self.limit[1] != inf and (new[1] == inf or new[1] > self.limit[1]):
            raise PermissionError(1, "Operation not permitted")  # no CAP_SYS_RESOURCE
        self.limit = new
        return self.limit


@pytest.mark.parametrize("release", ["5.11.0", "5.15.0-91-generic", "6.1.0-18-amd64", "6.18.44-fc-v1045"])
def test_from_5_11_nothing_is_changed(release):
    fake = FakePrlimit(65536, 65536)
    assert "not needed" in bpf.raise_memlock(release, fake) and fake.calls == []


def test_before_5_11_it_asks_for_unlimited_like_libbpf():
    fake = FakePrlimit(65536, 65536, refuse_above_hard=False)
    assert bpf.raise_memlock("5.10.0-28-amd64", fake) == "raised to unlimited"
    assert fake.limit == (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def test_without_cap_sys_resource_the_soft_limit_goes_up_to_the_hard_one():
    fake = FakePrlimit(65536, 256 << 20)  # systemd's LimitMEMLOCK=256M as the hard limit
    assert "hard limit" in bpf.raise_memlock("4.19.0", fake)
    assert fake.limit == (256 << 20, 256 << 20)


def test_a_hard_limit_at_the_soft_one_is_said():
    fake = FakePrlimit(65536, 65536)
    assert "raise LimitMEMLOCK" in bpf.raise_memlock("5.4.0", fake)


@pytest.mark.parametrize("release,want", [("5.10.0-28-amd64", (5, 10)), ("5.11", (5, 11)), ("4.9.0+", (4, 9)),
                                          ("6.18.44-fc-v1045", (6, 18)), ("garbage", (0, 0))])
def test_kernel_version(release, want):
    assert bpf._kernel_version(release) == want


def test_the_real_limit_of_a_process_is_raised_to_its_hard_limit():
    # In a child (this process's limits stay), with a lowered soft limit and a finite hard one: the real
    # prlimit64 path, as the daemon takes it on a 5.10 kernel under LimitMEMLOCK=.
    code = ("import resource; from shaperd.kernel import bpf\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)\n"
            "hard = hard if hard != resource.RLIM_INFINITY else 8 << 20\n"
            "resource.setrlimit(resource.RLIMIT_MEMLOCK, (4096, hard))\n"
            "import os\n"
            "if os.geteuid() == 0: resource.setrlimit(resource.RLIMIT_MEMLOCK, (4096, 4096 * 4)); hard = 4096 * 4\n"
            "print(bpf.raise_memlock('5.10.0'))\n"
            "print(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] in (hard, resource.RLIM_INFINITY))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       start_new_session=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "True", r.stdout
