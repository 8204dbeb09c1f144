"""The devlink rate encoder and decoder against bytes recorded from iproute2's ``devlink`` and a real kernel.

Fixtures (tests/unit/fixtures/devlink/, re-recorded by ``python -m
tests.kernel.devlink_record tests/unit/fixtures/devlink``) hold what
``devlink port function rate ...`` sent under Debian's 6.1 kernel (which
has the devlink family and no devlink device) and what that kernel answered:
the family id, then ENODEV for every rate write. The family id (0x15 there)
and the sequence number (the tool's clock) are the kernel's and the tool's
choice: each comparison puts the recorded ones into shaperd's encoder, so
every other byte is compared as is. ``family_absent.strace`` is a kernel
without the family (this machine's, recorded on the host with ``--absent``):
the lookup's ENOENT. RATE_GET dump replies with objects in
them cannot be recorded without a switchdev NIC: those are hand-built here
(``hand_built_*``), laid out as include/uapi/linux/devlink.h says.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
from pathlib import Path

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import devlink as dl
from shaperd.kernel import nlmsg

from .. import fake_netlink, strace_dump

FIX = Path(__file__).parent / "fixtures" / "devlink"
DEV = "pci/0000:00:00.0"


def exchanges(name: str) -> list[tuple[bytes, list[bytes]]]:
    """(request, reply datagrams) of a recorded run, in order (one socket: requests follow each other)."""
    out: list[tuple[bytes, list[bytes]]] = []
    for c in strace_dump.calls((FIX / name).read_text()):
        if c.name in ("sendto", "sendmsg"):
            out.append((c.data, []))
        else:
            out[-1][1].append(c.data)
    return out


def hdr(msg: bytes) -> tuple[int, int, int, int, int]:
    return nlmsg.HDR.unpack_from(msg)


def rate_request(name: str) -> tuple[bytes, int, int]:
    """The recorded RATE_* request (the one after CTRL_CMD_GETFAMILY), its family id and seq."""
    reqs = exchanges(name)
    assert len(reqs) == 2, f"{name}: expected GETFAMILY then one devlink request, got {len(reqs)}"
    req = reqs[1][0]
    _len, fam, _flags, seq, _pid = hdr(req)
    return req, fam, seq


def test_getfamily_request_is_the_tools():
    for name in ("rate_add.strace", "rate_del.strace", "rate_show.strace"):
        req = exchanges(name)[0][0]
        assert req == dl.getfamily_request(hdr(req)[3])


# (fixture, encoder for the recorded family id and seq) -- the same settings the tool was given
CASES = {
    # tx_share 10mbit tx_max 100mbit: the tool's bit units become bytes/s on the wire
    "rate_add.strace": lambda f, s: dl.rate_new(f, s, DEV, "shpd_a", tx_share_Bps=1_250_000,
                                                 tx_max_Bps=12_500_000),
    "rate_add_share_only.strace": lambda f, s: dl.rate_new(f, s, DEV, "shpd_b", tx_share_Bps=125_000_000),
    "rate_set_node.strace": lambda f, s: dl.rate_set_node(f, s, DEV, "shpd_a", tx_share_Bps=2_500_000,
                                                          tx_max_Bps=25_000_000),
    "rate_set_parent.strace": lambda f, s: dl.rate_set_leaf(f, s, DEV, 1, parent="shpd_a"),
    "rate_set_noparent.strace": lambda f, s: dl.rate_set_leaf(f, s, DEV, 1, parent=""),
    "rate_del.strace": lambda f, s: dl.rate_del(f, s, DEV, "shpd_a"),
    "rate_show.strace": lambda f, s: dl.rate_dump(f, s),
    "port_show.strace": lambda f, s: dl.port_dump(f, s),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_request_bytes_are_the_tools(name):
    req, fam, seq = rate_request(name)
    assert fam not in (dl.GENL_ID_CTRL, nlmsg.NLMSG_ERROR)  # really the devlink family, resolved by the tool
    mine = CASES[name](fam, seq)
    assert mine == req, f"shaperd {mine.hex()}\ndevlink {req.hex()}"


def test_units_on_the_wire_are_bytes_per_second():
    """10mbit (the CLI's bits) is 1 250 000 bytes/s in DEVLINK_ATTR_RATE_TX_SHARE, read from the tool's bytes."""
    req, _fam, _seq = rate_request("rate_add.strace")
    msg = next(nlmsg.messages(req))
    a = nlmsg.attrs(req, msg.start + dl.GENL.size, msg.end)
    assert nlmsg.u64(req, a[dl.ATTR_RATE_TX_SHARE]) == 10_000_000 // 8
    assert nlmsg.u64(req, a[dl.ATTR_RATE_TX_MAX]) == 100_000_000 // 8
    assert nlmsg.string(req, a[dl.ATTR_RATE_NODE_NAME]) == "shpd_a"


def with_seq(buf: bytes, seq: int) -> bytes:
    """Every message of a datagram with its seq replaced (iproute2 sends one seq for all its requests)."""
    out = bytearray(buf)
    for m in nlmsg.messages(buf):
        struct.pack_into("=I", out, m.start - 8, seq)
    return bytes(out)


class ReplaySocket:
    """Checks each request against the recorded one (seq aside, when ``any_seq``) and answers with the recording."""

    def __init__(self, replies: list[bytes], expect: list[bytes] | None = None, any_seq: bool = False):
        self.replies, self.expect, self.sent, self.timeouts = list(replies), expect, [], []
        self.any_seq = any_seq

    def send(self, data: bytes) -> int:
        if self.expect is not None:
            want = self.expect[len(self.sent)]
            if self.any_seq:
                want = with_seq(want, hdr(data)[3])
            assert data == want, f"sent {data.hex()}\nwant {want.hex()}"
        self.sent.append(data)
        return len(data)

    def settimeout(self, t):
        self.timeouts.append(t)

    def recv(self, _n: int) -> bytes:
        if not self.replies:
            raise socket.timeout()
        buf = self.replies.pop(0)
        return with_seq(buf, hdr(self.sent[-1])[3]) if self.any_seq else buf

    def close(self):
        pass


def replay(name: str) -> tuple[dl.DevlinkNl, ReplaySocket]:
    ex = exchanges(name)
    sock = ReplaySocket([r for _, rs in ex for r in rs], [q for q, _ in ex], any_seq=True)
    return dl.DevlinkNl(sock=sock, seq=hdr(ex[0][0])[3] - 1), sock


def test_family_id_decoded_from_the_kernels_answer():
    nl, _ = replay("rate_show.strace")
    assert nl.family() == rate_request("rate_show.strace")[1] == 0x15


def test_kernel_refuses_a_write_on_a_missing_device_with_a_typed_error():
    """Recorded: Debian 6.1 answered the tool's RATE_NEW with ENODEV (no devlink device)."""
    nl, sock = replay("rate_add.strace")  # both requests checked byte for byte, seq aside
    with pytest.raises(dl.NoDevlinkDevice) as e:
        nl.new_node(DEV, "shpd_a", 1_250_000, 12_500_000)
    assert e.value.errno == errno.ENODEV
    assert str(e.value) == f"create rate node shpd_a on {DEV}: No such device"


def test_empty_dump_on_a_kernel_without_devlink_devices():
    nl, _ = replay("rate_show.strace")
    assert nl.rates() == []
    nl, _ = replay("port_show.strace")
    assert nl.ports() == []


# -- hand-built dump replies (no switchdev NIC to record from) ------------------------------------

def strz(t, s):
    return nlmsg.rta(t, s.encode() + b"\0")


def hand_built_reply(fam: int, seq: int, attrs: bytes, cmd: int = dl.CMD_RATE_NEW) -> bytes:
    # The kernel answers RATE_GET with DEVLINK_CMD_RATE_NEW messages (devlink_nl_rate_fill), NLM_F_MULTI.
    payload = struct.pack("=BBH", cmd, dl.DEVLINK_GENL_VERSION, 0) + attrs
    return nlmsg.header(16 + len(payload), fam, nlmsg.NLM_F_MULTI, seq) + payload


def hand_built_done(seq: int) -> bytes:
    return nlmsg.header(20, nlmsg.NLMSG_DONE, nlmsg.NLM_F_MULTI, seq) + struct.pack("=i", 0)


def hand_built_node(fam, seq, dev, name, share, mx, parent=None):
    bus, d = dev.split("/")
    a = (strz(dl.ATTR_BUS_NAME, bus) + strz(dl.ATTR_DEV_NAME, d) + nlmsg.rta(dl.ATTR_RATE_TYPE, struct.pack("=H", 1))
         + nlmsg.rta(dl.ATTR_RATE_TX_SHARE, struct.pack("=Q", share)) + nlmsg.rta(dl.ATTR_RATE_TX_MAX,
                                                                                struct.pack("=Q", mx))
         + strz(dl.ATTR_RATE_NODE_NAME, name))
    if parent:
        a += strz(dl.ATTR_RATE_PARENT_NODE_NAME, parent)
    return hand_built_reply(fam, seq, a)


def hand_built_leaf(fam, seq, dev, port, parent=None, share=0, mx=0):
    bus, d = dev.split("/")
    a = (strz(dl.ATTR_BUS_NAME, bus) + strz(dl.ATTR_DEV_NAME, d) + nlmsg.rta(dl.ATTR_PORT_INDEX, struct.pack("=I", port))
         + nlmsg.rta(dl.ATTR_RATE_TYPE, struct.pack("=H", 0)) + nlmsg.rta(dl.ATTR_RATE_TX_SHARE, struct.pack("=Q", share))
         + nlmsg.rta(dl.ATTR_RATE_TX_MAX, struct.pack("=Q", mx)))
    if parent:
        a += strz(dl.ATTR_RATE_PARENT_NODE_NAME, parent)
    return hand_built_reply(fam, seq, a)


def test_decode_hand_built_rate_dump():
    fam, seq, pf = 0x15, 7, "pci/0000:3b:00.0"
    buf = (hand_built_node(fam, seq, pf, "shpd_a", 1_250_000, 12_500_000)
           + hand_built_node(fam, seq, pf, "grp", 0, 5, parent="root")
           + hand_built_leaf(fam, seq, pf, 2, parent="shpd_a", mx=999) + hand_built_leaf(fam, seq, pf, 3))
    sock = ReplaySocket([buf, hand_built_done(seq)])
    rows = dl.DevlinkNl(sock=sock, family=fam, seq=seq - 1).rates()
    assert rows == [
        dl.RateRow(pf, dl.RATE_TYPE_NODE, node="shpd_a", tx_share_Bps=1_250_000, tx_max_Bps=12_500_000),
        dl.RateRow(pf, dl.RATE_TYPE_NODE, node="grp", tx_share_Bps=0, tx_max_Bps=5, parent="root"),
        dl.RateRow(pf, dl.RATE_TYPE_LEAF, port_index=2, tx_max_Bps=999, parent="shpd_a"),
        dl.RateRow(pf, dl.RATE_TYPE_LEAF, port_index=3),
    ]
    assert [r.handle for r in rows] == [f"{pf}/shpd_a", f"{pf}/grp", f"{pf}/2", f"{pf}/3"]
    assert sock.sent == [dl.rate_dump(fam, seq)]


def test_decode_hand_built_port_dump():
    fam, seq = 0x15, 3
    a = (strz(dl.ATTR_BUS_NAME, "pci") + strz(dl.ATTR_DEV_NAME, "0000:3b:00.0")
         + nlmsg.rta(dl.ATTR_PORT_INDEX, struct.pack("=I", 2)) + nlmsg.rta(dl.ATTR_PORT_FLAVOUR, struct.pack("=H", 4))
         + nlmsg.rta(dl.ATTR_PORT_PCI_PF_NUMBER, struct.pack("=H", 0))
         + nlmsg.rta(dl.ATTR_PORT_PCI_VF_NUMBER, struct.pack("=H", 1)) + strz(dl.ATTR_PORT_NETDEV_NAME, "eth2"))
    sock = ReplaySocket([hand_built_reply(fam, seq, a, cmd=dl.CMD_PORT_GET + 2), hand_built_done(seq)])
    (row,) = dl.DevlinkNl(sock=sock, family=fam, seq=seq - 1).ports()
    assert row == dl.PortRow("pci/0000:3b:00.0", 2, flavour=dl.PORT_FLAVOUR_PCI_VF, pf=0, vf=1, netdev="eth2")


def test_malformed_rate_reply_is_a_typed_error():
    buf = hand_built_reply(0x15, 1, strz(dl.ATTR_BUS_NAME, "pci") + strz(dl.ATTR_DEV_NAME, "x")
                           + nlmsg.rta(dl.ATTR_RATE_TYPE, struct.pack("=H", 1)))
    with pytest.raises(KernelError, match="a node without a name"):
        dl.DevlinkNl(sock=ReplaySocket([buf, hand_built_done(1)]), family=0x15).rates()


def err_reply(seq: int, code: int, text: str = "") -> bytes:
    orig = nlmsg.header(16, 0x15, 5, seq)
    body = struct.pack("=i", -code) + orig
    flags = dl.NLM_F_CAPPED
    if text:
        body += strz(dl.NLMSGERR_ATTR_MSG, text)
        flags |= dl.NLM_F_ACK_TLVS
    return nlmsg.header(16 + len(body), nlmsg.NLMSG_ERROR, flags, seq) + body


def test_eopnotsupp_with_the_kernels_message():
    sock = ReplaySocket([err_reply(1, errno.EOPNOTSUPP, "rate node creation not supported")])
    with pytest.raises(dl.RateUnsupported) as e:
        dl.DevlinkNl(sock=sock, family=0x15).new_node("pci/0000:3b:00.0", "shpd_a", 1, 2)
    assert str(e.value) == ("create rate node shpd_a on pci/0000:3b:00.0: Operation not supported "
                            "(rate node creation not supported)")


def test_missing_family_is_devlink_absent():
    sock = ReplaySocket([err_reply(1, errno.ENOENT)])
    with pytest.raises(dl.DevlinkAbsent):
        dl.DevlinkNl(sock=sock).rates()
    assert len(sock.sent) == 1  # only the family lookup: nothing else is tried


def test_deadline_covers_the_whole_answer():
    t = [0.0]
    class Slow(ReplaySocket):
        def recv(self, n):
            t[0] += 3.0
            raise socket.timeout()
    with pytest.raises(KernelError) as e:
        dl.DevlinkNl(sock=Slow([]), family=0x15, timeout_s=5.0, clock=lambda: t[0]).rates()
    assert e.value.errno == errno.ETIMEDOUT


def test_interrupted_dump_is_read_again():
    fam = 0x15
    intr = bytearray(hand_built_node(fam, 1, "pci/0000:3b:00.0", "shpd_a", 1, 2))
    struct.pack_into("=H", intr, 6, nlmsg.NLM_F_MULTI | nlmsg.NLM_F_DUMP_INTR)
    sock = ReplaySocket([bytes(intr), hand_built_done(1), hand_built_node(fam, 2, "pci/0000:3b:00.0", "shpd_b", 1, 2),
                         hand_built_done(2)])
    rows = dl.DevlinkNl(sock=sock, family=fam).rates()
    assert [r.node for r in rows] == ["shpd_b"] and len(sock.sent) == 2


def test_a_kernel_without_the_family_is_devlink_absent():
    """Recorded on a kernel without the devlink family (recording.json "absent": this machine's): the tool's
    family lookup got ENOENT. shaperd's lookup is the same request, byte for byte (seq aside), and that
    answer is a typed DevlinkAbsent; nothing else is sent."""
    nl, sock = replay("family_absent.strace")
    with pytest.raises(dl.DevlinkAbsent) as e:
        nl.rates()
    assert e.value.errno == errno.ENOENT and "no devlink family" in str(e.value)
    assert len(sock.sent) == 1


def test_the_fake_kernels_missing_family_is_the_recorded_answer():
    """tests/fake_netlink.py answers an unknown family as the kernel did (seq and port id are the fake's)."""
    ((req, (reply,)),) = exchanges("family_absent.strace")
    assert fake_netlink.error_reply(req, errno.ENOENT) == fake_netlink.restamp(reply, hdr(req)[3])


def test_recording_metadata():
    meta = json.loads((FIX / "recording.json").read_text())
    assert meta["uname"].startswith("6.1")
    assert all(rc == 1 for n, rc in meta["rc"].items() if n.startswith("rate_") and n != "rate_show")


def test_shaperds_own_reader_on_the_real_61_kernel():
    """Recorded in the same guest: shaperd's DevlinkNl resolved the family the tool used, dumped an empty
    tree, and the kernel's refusal of a RATE_NEW on a device that does not exist came back typed."""
    meta = json.loads((FIX / "recording.json").read_text())["shaperd"]
    assert meta["family"] == rate_request("rate_add.strace")[1]
    assert meta["rates"] == []
    assert meta["new_node"]["type"] == "NoDevlinkDevice" and meta["new_node"]["errno"] == errno.ENODEV
