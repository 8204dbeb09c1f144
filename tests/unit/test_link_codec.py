"""kernel/link.new_veth is byte for byte what ``ip link add ... type veth peer ...`` sends.

Fixtures: tests/unit/fixtures/link/ (README.md gives the commands that recorded them). The probe builds its
throwaway pairs with it (kernel/probe.py); tests/integration/test_link_veth.py reads one back from a kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shaperd.kernel import link, nlmsg, tc

from ..strace_dump import sent

FIX = Path(__file__).parent / "fixtures" / "link"


@pytest.mark.parametrize("fixture,msg", [
    ("add_veth", lambda: link.new_veth("p0", "p1")),
    ("add_veth_queues", lambda: link.new_veth("q0", "q1", num_tx_queues=4)),
])
def test_new_veth_is_what_ip_link_add_sends(fixture, msg):
    (theirs,) = sent((FIX / f"{fixture}.strace").read_text())[:1]
    ours = tc._encoder(msg())(7)
    assert nlmsg.HDR.unpack_from(ours)[:3] == nlmsg.HDR.unpack_from(theirs)[:3]  # length, type, flags
    assert ours[16:] == theirs[16:]


@pytest.mark.parametrize("name,peer", [("", "p1"), ("p0", ""), ("x" * 16, "p1"), ("p0", "y" * 16)])
def test_a_name_the_kernel_would_refuse_is_never_encoded(name, peer):
    with pytest.raises(ValueError, match="interface name"):
        link.new_veth(name, peer)
