"""The RDMA netlink reader against bytes recorded from iproute2's ``rdma`` and a real kernel (rxe, under QEMU).

The fixtures (tests/unit/fixtures/rdma_nl/, re-recorded by ``python -m
tests.kernel.vm --record``) hold what ``rdma`` sent and what the kernel
answered. A fake socket checks that the reader sends exactly the tool's
bytes and hands it the kernel's recorded answers; the decoded rows must say
what the tool printed and what sysfs said in the same guest. Synthetic
replies cover what a quiet rxe device never shows: errors, interrupted
dumps, deadlines, malformed messages.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
from pathlib import Path

import pytest

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg, rdma_nl

from .. import strace_dump

FIX = Path(__file__).parent / "fixtures" / "rdma_nl"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def exchanges(strace_name: str) -> list[tuple[bytes, list[bytes]]]:
    """(request, reply datagrams) per socket of a recorded tool run, in order."""
    out: dict[int, tuple[bytes, list[bytes]]] = {}
    for c in strace_dump.calls(fixture(strace_name)):
        if c.name in ("sendto", "sendmsg"):
            out[c.fd] = (c.data, [])
        else:
            out[c.fd][1].append(c.data)
    return list(out.values())


def seq_of(msg: bytes) -> int:
    return nlmsg.HDR.unpack_from(msg)[3]


class ReplaySocket:
    """Expects one request byte for byte, then returns the recorded datagrams."""

    def __init__(self, request: bytes | None, replies: list[bytes], fail=None):
        self.request, self.replies, self.sent, self.fail = request, list(replies), [], fail
        self.timeouts: list[float] = []

    def send(self, data: bytes) -> int:
        if self.request is not None:
            assert data == self.request, f"sent {data.hex()}\nrdma sent {self.request.hex()}"
        self.sent.append(data)
        return len(data)

    def settimeout(self, t):
        self.timeouts.append(t)

    def recv(self, _n: int) -> bytes:
        if self.fail is not None:
            raise self.fail
        if not self.replies:
            raise socket.timeout()
        return self.replies.pop(0)

    def close(self):
        pass


def replay(strace_name: str, index: int) -> tuple[rdma_nl.RdmaNlReader, ReplaySocket]:
    req, replies = exchanges(strace_name)[index]
    sock = ReplaySocket(req, replies)
    return rdma_nl.RdmaNlReader(sock=sock, seq=seq_of(req) - 1), sock


# -- requests are iproute2's, byte for byte ---------------------------------------------------------

def test_device_dump_and_get_requests_are_the_rdma_tools_bytes():
    (dump, _), (get, _) = exchanges("rdma_dev_show.strace")
    assert rdma_nl.request(rdma_nl.CMD_GET, seq_of(dump), dump=True) == dump
    assert rdma_nl.request(rdma_nl.CMD_GET, seq_of(get), dev_index=0) == get
    assert struct.unpack_from("=H", dump, 4)[0] == (5 << 10) + 1  # RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, CMD_GET)


def test_port_stat_and_system_requests_are_the_rdma_tools_bytes():
    (_, _), (port, _) = exchanges("rdma_link_show.strace")
    (_, _), (stat, _) = exchanges("rdma_stat_show.strace")
    sysreq = exchanges("rdma_sys_show.strace")[-1][0]
    assert rdma_nl.request(rdma_nl.CMD_PORT_GET, seq_of(port), dev_index=0, port=1) == port
    assert rdma_nl.request(rdma_nl.CMD_STAT_GET, seq_of(stat), dev_index=0, port=1) == stat
    assert rdma_nl.request(rdma_nl.CMD_SYS_GET, seq_of(sysreq)) == sysreq


# -- the kernel's recorded answers, decoded ---------------------------------------------------------

def test_device_rows_say_what_rdma_dev_show_printed():
    tool = json.loads(fixture("rdma_dev_show.json"))
    reader, sock = replay("rdma_dev_show.strace", 0)
    devs = reader.devices()
    assert len(sock.sent) == 1 and [d.name for d in devs] == [t["ifname"] for t in tool]
    d, t = devs[0], tool[0]
    assert (d.index, d.node_guid, d.sys_image_guid) == (t["ifindex"], t["node_guid"], t["sys_image_guid"])
    assert d.node_type == 1 and t["node_type"] == "ca"
    assert (d.ports, d.protocol, d.link_layer, d.fw_version) == (1, "roce", "Ethernet", None)
    reader, _ = replay("rdma_dev_show.strace", 1)
    assert reader.device(0) == d  # the acked get answers the same row


def test_port_row_says_what_rdma_link_show_printed():
    t = json.loads(fixture("rdma_link_show.json"))[0]
    reader, _ = replay("rdma_link_show.strace", 1)
    p = reader.port(0, 1)
    assert (p.dev_name, p.port, p.netdev, p.netdev_index) == (t["ifname"], t["port"], t["netdev"], t["netdev_index"])
    assert (p.state_name, t["state"]) == ("ACTIVE", "ACTIVE")
    assert (p.phys_state_name, t["physical_state"]) == ("LinkUp", "LINK_UP")
    assert (p.lid, p.sm_lid) == (None, None)  # RoCE: the kernel sends no LIDs


def test_hw_counters_say_what_rdma_statistic_printed():
    t = json.loads(fixture("rdma_stat_show.json"))[0]
    reader, _ = replay("rdma_stat_show.strace", 1)
    row = reader.hw_counters(0, 1)
    assert (row.dev_name, row.port) == (t["ifname"], t["port"])
    assert dict(row.counters) == {k: v for k, v in t.items() if k not in ("ifname", "port")}
    assert len(row.counters) == 15 and "sent_pkts" in row.counters


def test_system_row_says_what_rdma_system_show_printed():
    reader, _ = replay("rdma_sys_show.strace", -1)
    sysrow = reader.system()
    assert fixture("rdma_sys_show.txt").startswith("netns shared")
    assert (sysrow.netns_mode, sysrow.netns_exclusive) == (1, False)


def test_a_kernel_with_ib_core_and_no_device_answers_an_empty_dump():
    reader, _ = replay("rdma_dev_show_empty.strace", 0)
    assert reader.devices() == []


def test_netlink_agrees_with_sysfs_recorded_in_the_same_guest():
    rec = json.loads(fixture("sysfs_rxe.json"))
    dev = rec["sysfs"]["devices"][0]
    port = dev["ports"][0]
    reader, _ = replay("rdma_dev_show.strace", 0)
    d = reader.devices()[0]
    reader, _ = replay("rdma_link_show.strace", 1)
    p = reader.port(0, 1)
    assert (d.name, d.node_guid, d.link_layer) == (dev["name"], dev["node_guid"], port["link_layer"])
    assert (p.state_name, p.phys_state_name) == (port["state"], port["phys_state"])
    assert [p.netdev] == port["netdevs"] == [dev["parent"]] and p.netdev_index == rec["veth_ifindex"]
    assert rec["counters"]["has_counters_dir"] is False and rec["counters"]["xmit_data_words"] is None


# -- errors, interrupted dumps, deadlines (synthetic) -----------------------------------------------

def msg(typ: int, flags: int, seq: int, body: bytes) -> bytes:
    return nlmsg.header(nlmsg.HDR.size + len(body), typ, flags, seq) + body


def err(seq: int, code: int) -> bytes:
    return msg(nlmsg.NLMSG_ERROR, 0, seq, nlmsg.I32.pack(-code) + b"\0" * 16)


def done(seq: int, flags: int = nlmsg.NLM_F_MULTI) -> bytes:
    return msg(nlmsg.NLMSG_DONE, flags, seq, b"\0\0\0\0")


def dev_msg(seq: int, name: str, index: int = 0, flags: int = nlmsg.NLM_F_MULTI) -> bytes:
    body = nlmsg.rta(rdma_nl.ATTR_DEV_INDEX, nlmsg.U32.pack(index)) + nlmsg.rta(rdma_nl.ATTR_DEV_NAME, name.encode() + b"\0")
    return msg(rdma_nl.msg_type(rdma_nl.CMD_GET), flags, seq, body)


def reader_with(replies, **kw) -> tuple[rdma_nl.RdmaNlReader, ReplaySocket]:
    sock = ReplaySocket(None, replies, kw.pop("fail", None))
    return rdma_nl.RdmaNlReader(sock=sock, **kw), sock


def test_an_error_reply_is_a_kernel_error_naming_what_was_read():
    r, _ = reader_with([err(1, errno.EPERM)])
    with pytest.raises(KernelError) as e:
        r.devices()
    assert e.value.errno == errno.EPERM and str(e.value) == "dump RDMA devices on node: Operation not permitted"


def test_unknown_device_or_port_and_a_driver_without_hw_counters_are_none():
    r, _ = reader_with([err(1, errno.EINVAL), err(2, errno.EINVAL), err(3, errno.EOPNOTSUPP)])
    assert r.device(7) is None and r.port(0, 9) is None and r.hw_counters(0, 1) is None
    r, _ = reader_with([err(1, errno.EPERM)])
    with pytest.raises(KernelError, match="hw counters of mlx5_0:1 on node: Operation not permitted"):
        r.hw_counters(0, 1, "mlx5_0:1")


def test_an_interrupted_dump_is_read_again_and_a_table_that_keeps_changing_fails():
    intr = nlmsg.NLM_F_MULTI | nlmsg.NLM_F_DUMP_INTR
    r, sock = reader_with([dev_msg(1, "mlx5_0", flags=intr) + done(1, intr),
                           dev_msg(2, "mlx5_0") + dev_msg(2, "mlx5_1", 1) + done(2)])
    assert [d.name for d in r.devices()] == ["mlx5_0", "mlx5_1"] and len(sock.sent) == 2
    r, sock = reader_with([dev_msg(i, "x", flags=intr) + done(i, intr) for i in range(1, 5)])
    with pytest.raises(KernelError) as e:
        r.devices()
    assert e.value.errno == errno.EINTR and len(sock.sent) == rdma_nl.DUMP_ATTEMPTS


def test_a_late_answer_to_an_earlier_request_is_skipped():
    r, _ = reader_with([dev_msg(41, "stale") + dev_msg(42, "mlx5_0") + done(42)], seq=41)
    assert [d.name for d in r.devices()] == ["mlx5_0"]


def test_every_exchange_has_one_deadline_for_the_whole_answer():
    r, _ = reader_with([], timeout_s=0.5)
    with pytest.raises(KernelError) as e:
        r.devices()
    assert e.value.errno == errno.ETIMEDOUT and "within 0.5 s" in str(e.value)
    # A dump that trickles forever: each datagram arrives in time, the whole answer does not.
    now = [0.0]

    def clock():
        now[0] += 0.2
        return now[0]

    r, sock = reader_with([dev_msg(1, f"d{i}", i) for i in range(50)], timeout_s=1.0, clock=clock)
    with pytest.raises(KernelError) as e:
        r.devices()
    assert e.value.errno == errno.ETIMEDOUT and len(sock.replies) > 40
    assert all(0 < t <= 1.0 for t in sock.timeouts)


def test_a_socket_error_and_a_malformed_reply_are_kernel_errors():
    r, _ = reader_with([], fail=OSError(errno.ENOBUFS, "No buffer space available"))
    with pytest.raises(KernelError, match="read RDMA devices on node: No buffer space available"):
        r.devices()
    nameless = msg(rdma_nl.msg_type(rdma_nl.CMD_GET), nlmsg.NLM_F_MULTI, 1,
                   nlmsg.rta(rdma_nl.ATTR_DEV_INDEX, nlmsg.U32.pack(0)))
    r, _ = reader_with([nameless + done(1)])
    with pytest.raises(KernelError, match="no device index or name attribute") as e:
        r.devices()
    assert e.value.errno == errno.EBADMSG


def test_a_refused_socket_is_rdma_netlink_absent(monkeypatch):
    def refuse(*_a, **_k):
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    monkeypatch.setattr(rdma_nl.socket, "socket", refuse)
    with pytest.raises(rdma_nl.RdmaNetlinkAbsent) as e:
        rdma_nl.RdmaNlReader()
    assert isinstance(e.value, KernelError) and e.value.errno == errno.EPROTONOSUPPORT
    assert "ib_core is not loaded" in str(e.value)
