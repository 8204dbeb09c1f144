"""The EDT stamper on the running kernel, with BPF_PROG_TEST_RUN on crafted packets (root, no traffic).

The same cases run in the QEMU guest on Debian's 6.1 kernel (tests/kernel/test_edt.py).
"""

import os

import pytest

from tests import edt_cases

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (bpf)")


def test_stamps_departure_times_per_tenant_with_a_horizon():
    result = edt_cases.run_cases()
    assert edt_cases.problems(result) == []
