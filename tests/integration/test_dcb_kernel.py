"""The real kernel's DCB answer on a device without DCB ops (a veth): a typed error that costs nothing else."""

from __future__ import annotations

import errno

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import dcb
from shaperd.kernel.rtnl import RtnlReader


def test_veth_answers_not_supported_typed(bed):
    with RtnlReader(bed.node, timeout_s=5.0) as reader:
        client = dcb.DcbClient(reader)
        with pytest.raises(dcb.DcbNotSupported) as got:
            client.get("up0")
        assert got.value.errno == errno.EOPNOTSUPP
        assert str(got.value) == "read DCB IEEE configuration on up0: Operation not supported"
        with pytest.raises(dcb.DcbNotSupported):
            client.set("up0", maxrate_kbps=(0,) * 8)
        with pytest.raises(dcb.DcbNotSupported):
            client.set("up0", apps=[dcb.App(dcb.SEL_DSCP, 26, 1)])
        # A device that does not exist is not "not supported".
        with pytest.raises(KernelError) as missing:
            client.get("nosuchdev0")
        assert not isinstance(missing.value, dcb.DcbNotSupported) and missing.value.errno == errno.ENODEV
        # The socket is still good for the next read: the errors cost nothing else.
        assert any(link.name == "up0" for link in reader.links())
