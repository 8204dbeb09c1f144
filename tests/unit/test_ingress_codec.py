"""The tenant-ingress backend's requests are byte for byte what iproute2 sends; the recorded filter dump decodes.

Fixtures: tests/unit/fixtures/ingress/ (README.md gives the commands that recorded them).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from shaperd.backends.ingress import kernel_tc, ops
from shaperd.backends.ingress.objects import INGRESS_HOOK, PRIO_REDIRECT
from shaperd.kernel import nlmsg, rtnl_rows, tc

from ..strace_dump import received, sent

FIX = Path(__file__).parent / "fixtures" / "ingress"


def theirs(name: str) -> bytes:
    (msg,) = sent((FIX / f"{name}.strace").read_text())[:1]
    return msg


def ours(op) -> bytes:
    return tc._encoder(tc.build_message(op, codec=kernel_tc.CODEC))(7)


def same(a: bytes, b: bytes) -> None:
    assert nlmsg.HDR.unpack_from(a)[:3] == nlmsg.HDR.unpack_from(b)[:3]  # length, type, flags
    assert a[16:] == b[16:]  # sequence number and port id aside, equal


def test_the_redirect_is_what_tc_filter_add_mirred_egress_redirect_sends():
    t = theirs("add_redirect")
    uplink = struct.unpack_from("=i", t, 20)[0]
    assert (uplink, struct.unpack_from("=I", t, 32)[0] >> 16) == (3, PRIO_REDIRECT)
    op = ops.AddRedirect(device="up0", ifindex=uplink, ifb="shpi-up0", ifb_ifindex=4)
    same(ours(op), t)


def test_deleting_the_redirect_is_what_tc_filter_del_prio_sends():
    op = ops.DeleteRedirect(device="up0", ifindex=3)
    same(ours(op), theirs("del_redirect"))


@pytest.mark.parametrize("name,op", [
    ("add_ifb", ops.CreateIfb(device="shpi-up0", ifindex=0, uplink="up0")),
    ("set_ifb_up", ops.SetIfbUp(device="shpi-up0", ifindex=5)),
    ("del_ifb", ops.DeleteIfb(device="shpi-up0", ifindex=4)),
])
def test_the_ifbs_link_requests_are_what_ip_link_sends(name, op):
    same(ours(op), theirs(name))


def test_a_redirect_without_its_ifbs_ifindex_is_never_encoded():
    with pytest.raises(ValueError, match="ifindex is not known"):
        tc.build_message(ops.AddRedirect(device="up0", ifindex=3, ifb="shpi-up0", ifb_ifindex=0),
                         codec=kernel_tc.CODEC)


def test_the_recorded_filter_dump_decodes_to_the_redirect_and_its_target():
    rows = []
    for buf in received((FIX / "show_redirect.strace").read_text()):
        for m in nlmsg.messages(buf):
            if m.type == 44:  # RTM_NEWTFILTER
                row = rtnl_rows.tc_filter(buf, m)
                if row is not None:
                    rows.append(row)
    (row,) = rows  # the hash table and the chain head are structure, not filters
    assert (row.parent, row.prio, row.kind, row.protocol) == (INGRESS_HOOK, PRIO_REDIRECT, "u32", 3)
    assert row.keys == ((0, 0, 0),) and row.mirred == (1, 4)  # egress redirect to ifindex 4 (shpi-up0)
    from shaperd.backends.ingress.backend import owns_filter

    assert owns_filter(row)


def test_a_u32_filter_without_an_action_has_no_mirred():
    # A plain classifying u32 filter, encoded as the dump carries it (same attributes).
    from shaperd.backends.common.objects import U32Filter, U32Key
    from shaperd.backends.common.kernel_tc import u32_options

    m = tc.msg(44, 0, 3, 0x800800, INGRESS_HOOK, tc.info(PRIO_REDIRECT, 3), "u32",
               u32_options(U32Filter(PRIO_REDIRECT, 3, 0x73690002, (U32Key(0, 0, 0),))))
    buf = tc._encoder(m)(1)
    (msg,) = list(nlmsg.messages(buf))
    row = rtnl_rows.tc_filter(buf, msg)
    assert row.mirred is None and row.classid == 0x73690002
