"""kernel/vf.py: the VF-rate request byte for byte against iproute2's, and the read-back decoder.

The requests are compared with ``ip link set dev X vf N min_tx_rate A max_tx_rate B`` as strace
recorded it (tests/unit/fixtures/vfrate/, nlmsg seq and pid aside). The decoder runs on the
recorded reply of a veth (no VF info) and on a hand-built PF reply with VF info, whose layout is
checked against the uapi structs and against pyroute2's own decoder.
"""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from shaperd.backends.vfrate.ops import SetVfRate
from shaperd.kernel import nlmsg
from shaperd.backends.vfrate import kernel as vf

from ..strace_dump import received, sent

FIX = Path(__file__).parent / "fixtures" / "vfrate"
SETTINGS = [("set_vf0_min100_max1000", 0, 100, 1000), ("set_vf3_min0_max25000", 3, 0, 25000),
            ("set_vf1_min2500_max0", 1, 2500, 0)]


def _without_seq_pid(b: bytes) -> bytes:
    return b[:8] + b"\0" * 8 + b[16:]


def _iproute2_request(name: str) -> bytes:
    reqs = [b for b in sent((FIX / f"{name}.strace").read_text())
            if nlmsg.HDR.unpack_from(b)[1] == vf.RTM_NEWLINK and len(b) > 32]
    assert len(reqs) == 1  # the probe before it is a bare 32-byte ifinfomsg
    return reqs[0]


@pytest.mark.parametrize("name,n,lo,hi", SETTINGS)
def test_the_request_is_byte_for_byte_what_ip_link_sends(name, n, lo, hi):
    theirs = _iproute2_request(name)
    ifindex = struct.unpack_from("=i", theirs, 20)[0]
    ours = vf.encode(SetVfRate(device="vfa", ifindex=ifindex, vf=n, min_mbps=lo, max_mbps=hi), seq=12345)
    assert _without_seq_pid(ours) == _without_seq_pid(theirs)
    # And the fields where they are in struct ifla_vf_rate, so the comparison cannot pass on two empty messages.
    assert len(ours) == 56 and struct.unpack_from("=III", ours, 44) == (n, lo, hi)
    assert struct.unpack_from("=HH", ours, 32) == (24, vf.IFLA_VFINFO_LIST)


def test_the_kernel_refuses_vf_rates_on_a_veth_with_eopnotsupp_as_recorded():
    replies = received((FIX / "set_vf0_min100_max1000.strace").read_text())
    last = replies[-1]
    m = next(nlmsg.messages(last))
    assert m.type == nlmsg.NLMSG_ERROR and nlmsg.error_code(last, m) == errno.EOPNOTSUPP


def test_the_read_asks_for_vf_info_without_stats_as_ip_link_show_does():
    theirs = sent((FIX / "show_veth.strace").read_text())[-1]
    ext_mask = nlmsg.rta(vf.IFLA_EXT_MASK, struct.pack("=I", vf.RTEXT_FILTER_VF | vf.RTEXT_FILTER_SKIP_STATS))
    assert ext_mask in theirs
    ours = vf.get_request(7)
    assert ours[16:] == ext_mask and struct.unpack_from("=i", ours, 4)[0] == 7


def test_a_veth_reply_has_no_vf_info():
    reply = next(b for b in received((FIX / "show_veth.strace").read_text()) if len(b) > 100)
    m = next(nlmsg.messages(reply))
    got = vf.decode(reply, m)
    assert got.name == "vfa" and not got.reported and got.vfs == () and got.num_vfs is None


def _pf_reply(ifindex: int = 5) -> bytes:
    """An RTM_NEWLINK reply of a PF with 3 VFs, built by hand from the uapi layout:
    VF 0 and 1 with IFLA_VF_RATE (struct ifla_vf_rate, 12 bytes), VF 2 only IFLA_VF_TX_RATE (8 bytes),
    each beside an IFLA_VF_MAC (struct ifla_vf_mac: u32 vf, u8 mac[32]) as drivers send it."""
    def info(n, rate=None, tx=None):
        body = nlmsg.rta(1, struct.pack("=I32s", n, bytes.fromhex(f"0c42a10301{n:02x}")))
        if tx is not None:
            body += nlmsg.rta(vf.IFLA_VF_TX_RATE, struct.pack("=II", n, tx))
        if rate is not None:
            body += nlmsg.rta(vf.IFLA_VF_RATE, struct.pack("=III", n, *rate))
        return nlmsg.rta(vf.IFLA_VF_INFO, body)
    vfs = info(1, rate=(0, 0), tx=0) + info(0, rate=(100, 1000), tx=1000) + info(2, tx=500)
    attrs = (nlmsg.rta(vf.IFLA_IFNAME, b"ens1f0\0") + nlmsg.rta(vf.IFLA_NUM_VF, struct.pack("=I", 3))
             + nlmsg.rta(vf.IFLA_VFINFO_LIST, vfs))
    body = struct.pack("=BBHiII", 0, 0, 1, ifindex, 0x1003, 0) + attrs
    return nlmsg.header(16 + len(body), vf.RTM_NEWLINK, 0, 1) + body


def test_the_decoder_reads_vf_rate_and_falls_back_to_tx_rate():
    buf = _pf_reply()
    got = vf.decode(buf, next(nlmsg.messages(buf)))
    assert (got.ifindex, got.name, got.num_vfs, got.reported) == (5, "ens1f0", 3, True)
    assert got.vfs == (vf.VfRateRow(0, 100, 1000), vf.VfRateRow(1, 0, 0), vf.VfRateRow(2, None, 500))
    assert got.vf(2).max_mbps == 500 and got.vf(7) is None


def test_the_hand_built_reply_is_what_pyroute2_decodes_independently():
    buf = _pf_reply()
    m = ifinfmsg(buf)
    m.decode()
    infos = m.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
    rates = {i.get_attr("IFLA_VF_RATE")["vf"]: (i.get_attr("IFLA_VF_RATE")["min_tx_rate"],
                                                i.get_attr("IFLA_VF_RATE")["max_tx_rate"])
             for i in infos if i.get_attr("IFLA_VF_RATE") is not None}
    assert rates == {0: (100, 1000), 1: (0, 0)}
    assert m.get_attr("IFLA_NUM_VF") == 3 and m["index"] == 5


class _Sock:
    def __init__(self, reply):
        self.reply, self.sent = reply, []

    def settimeout(self, t):
        pass

    def send(self, b):
        self.sent.append(b)
        # answer with the request's seq
        seq = struct.unpack_from("=I", b, 8)[0]
        self.out = self.reply[:8] + struct.pack("=I", seq) + self.reply[12:]

    def recv(self, n):
        return self.out


def test_read_pf_goes_through_the_raw_reader_and_maps_enodev_to_gone():
    from shaperd.kernel.rtnl import RtnlReader

    sock = _Sock(_pf_reply())
    got = vf.read_pf(RtnlReader(sock=sock), 5, "ens1f0")
    assert got.vf(0) == vf.VfRateRow(0, 100, 1000)
    assert struct.unpack_from("=HH", sock.sent[0], 4) == (vf.RTM_GETLINK, nlmsg.NLM_F_REQUEST)
    err = nlmsg.header(36, nlmsg.NLMSG_ERROR, 0, 1) + struct.pack("=i", -errno.ENODEV) + b"\0" * 16
    assert vf.read_pf(RtnlReader(sock=_Sock(err)), 5, "ens1f0") is None


class _Ipr:
    def __init__(self, code=None):
        self.code, self.msgs = code, []

    def nlm_request_batch(self, msgs):
        from pyroute2.netlink.exceptions import NetlinkError

        self.msgs.extend(msgs)
        if self.code:
            raise NetlinkError(self.code)


def test_a_refusal_is_a_typed_error_naming_the_vf_and_the_pf():
    op = SetVfRate(device="ens1f0", ifindex=5, vf=3, min_mbps=100, max_mbps=1000, tenant="a")
    res = vf.apply_ops(_Ipr(errno.EINVAL), [op])
    assert res.applied == [] and len(res.failed) == 1
    err = res.failed[0][1]
    assert str(err) == "set VF 3 rates min 100 max 1000 Mbit/s on ens1f0: Invalid argument"
    assert err.errno == errno.EINVAL and err.device == "ens1f0"
    ok = _Ipr()
    assert vf.apply_ops(ok, [op, op]).applied == [op, op] and len(ok.msgs) == 2
