"""shaperd's generic netlink and RDMA netlink clients against this machine's kernel (read-only questions).

Moved out of the unit tier, which never reaches the kernel (tests/unit/conftest.py):
the unit tests replay what a kernel answered (tests/unit/fixtures/devlink,
fixtures/rdma_nl); these ask the running one, so a recording that no longer
matches a real kernel shows here.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import devlink as dl
from shaperd.kernel import rdma_nl


def test_devlink_this_kernel_has_no_family_or_a_family_whose_dump_answers():
    """No devlink family is a typed DevlinkAbsent (ENOENT); a kernel with the family answers the rate dump."""
    try:
        nl = dl.DevlinkNl()
    except KernelError as e:  # pragma: no cover - a sandbox without netlink sockets
        pytest.skip(f"no generic netlink socket: {e}")
    with nl:
        try:
            rows = nl.rates()
        except dl.DevlinkAbsent as e:
            assert e.errno == errno.ENOENT and "no devlink family" in str(e)
            return
        assert isinstance(rows, list)  # pragma: no cover - a kernel with devlink (the QEMU recording covers it)


def test_rdma_netlink_this_kernels_answer_is_typed():
    """No ib_core means a refused socket (RdmaNetlinkAbsent); otherwise the dump names sysfs's devices."""
    if not Path("/sys/module/ib_core").exists():
        with pytest.raises(rdma_nl.RdmaNetlinkAbsent):
            rdma_nl.RdmaNlReader()
        return
    with rdma_nl.RdmaNlReader() as r:
        names = sorted(d.name for d in r.devices())
    ib = Path("/sys/class/infiniband")
    assert names == (sorted(os.listdir(ib)) if ib.exists() else [])
