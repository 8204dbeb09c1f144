"""RtnlReader decoding recorded kernel replies: no root, no namespace, no kernel.

The replies in tests/unit/fixtures/netlink/ were recorded from a real kernel
by record.py there (its README gives the command and the kernel). A fake
socket serves them, one recorded reply per request, re-stamping each
message's nlmsg_seq with the seq of the request the reader just sent. The
expected values are what record.py configured (its SETUP list); ifindexes are
the kernel's, read from recording.json.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
from pathlib import Path

import pytest

from shaperd.discovery import pods
from shaperd.core.errors import KernelError
from shaperd.kernel import bpf, nlmsg, rtnl
from shaperd.kernel import rtnl_rows as rows
from shaperd.kernel.rtnl import RtnlReader
from shaperd.kernel.rtnl_rows import TC_H_ROOT, U32KeyRow

FIXTURES = Path(__file__).parent / "fixtures" / "netlink"
META = json.loads((FIXTURES / "recording.json").read_text())
IDX = META["ifindex"]
UP0, UP1, BR0, LO = IDX["up0"], IDX["up1"], IDX["br0"], IDX["lo"]
HTB_ROOT = 0x73680000
ETH_P_ALL, ETH_P_IP, ETH_P_IPV6 = 0x0003, 0x0800, 0x86DD
RT_TABLE_MAIN, RT_TABLE_LOCAL = 254, 255
RTN_UNICAST, RTN_BLACKHOLE, RTN_UNREACHABLE, RTN_PROHIBIT = 1, 6, 7, 8
RTM_NEWNEIGH = 28


def classid(major: int, minor: int) -> int:
    return (major << 16) | minor


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def datagrams(name: str) -> list[bytes]:
    return [bytes.fromhex(h) for h in fixture(name)["datagrams"]]


def restamp(datagram: bytes, seq: int) -> bytes:
    out = bytearray(datagram)
    for m in nlmsg.messages(datagram):
        struct.pack_into("=I", out, m.start - 8, seq)  # nlmsghdr.nlmsg_seq
    return bytes(out)


def with_flags(datagram: bytes, flags: int, which=lambda m: True) -> bytes:
    """A copy with ``flags`` or-ed into the header of every message ``which`` selects."""
    out = bytearray(datagram)
    for m in nlmsg.messages(datagram):
        if which(m):
            struct.pack_into("=H", out, m.start - 10, m.flags | flags)  # nlmsghdr.nlmsg_flags
    return bytes(out)


def with_errno(datagram: bytes, code: int, which) -> bytes:
    """A copy whose NLMSG_ERROR / NLMSG_DONE selected by ``which`` carries -``code``."""
    out = bytearray(datagram)
    for m in nlmsg.messages(datagram):
        if which(m):
            struct.pack_into("=i", out, m.start, -code)
    return bytes(out)


def without_seq(request: bytes) -> bytes:
    return request[:8] + b"\0\0\0\0" + request[12:]


class RecordedSocket:
    """Socket-like: each request is answered with the next recorded reply (a list of datagrams)."""

    def __init__(self, *replies: list[bytes], expect: list[bytes] | None = None):
        self.replies = list(replies)
        self.expect = expect  # recorded requests the reader's must equal, seq aside
        self.sent: list[bytes] = []
        self.pending: list[bytes] = []
        self.timeout_s = None
        self.closed = False

    def settimeout(self, s: float) -> None:
        self.timeout_s = s

    def send(self, data: bytes) -> int:
        assert not self.pending, "a new request before the last reply was read"
        assert self.replies, "more requests than recorded replies"
        if self.expect is not None:
            assert without_seq(data) == without_seq(self.expect[len(self.sent) % len(self.expect)]), \
                "the reader's request differs from the recorded one: re-record (fixtures/netlink/README)"
        self.sent.append(bytes(data))
        seq = nlmsg.HDR.unpack_from(data)[3]
        self.pending = [restamp(d, seq) for d in self.replies.pop(0)]
        return len(data)

    def recv(self, bufsize: int) -> bytes:
        assert self.pending, "the reader read past the recorded reply"
        d = self.pending.pop(0)
        assert len(d) <= bufsize
        return d

    def close(self) -> None:
        self.closed = True


def reader_on(*names: str, same_request: bool = True) -> tuple[RtnlReader, RecordedSocket]:
    """A reader answered with the recorded replies of ``names``, in order.

    ``same_request``: the reader's requests must equal the recorded ones (seq aside), so a
    reader change that alters a request shows up here as a fixture to re-record."""
    docs = [fixture(n) for n in names]
    made_by_reader = same_request and all("serve_as" not in d for d in docs)
    expect = [bytes.fromhex(d["sent"][0]) for d in docs] if made_by_reader else None
    sock = RecordedSocket(*[[bytes.fromhex(h) for h in d["datagrams"]] for d in docs], expect=expect)
    return RtnlReader(sock=sock, timeout_s=0.25), sock


def reply_errno(name: str) -> int:
    """The errno the kernel's recorded reply ended with (NLMSG_ERROR or NLMSG_DONE)."""
    for d in datagrams(name):
        for m in nlmsg.messages(d):
            if m.type in (nlmsg.NLMSG_ERROR, nlmsg.NLMSG_DONE):
                return nlmsg.error_code(d, m)
    raise AssertionError(f"{name}: no NLMSG_ERROR or NLMSG_DONE")


# -- links, routes ---------------------------------------------------------------------------------
def test_links_names_kinds_mtu_and_state():
    reader, _ = reader_on("links")
    by_name = {l.name: l for l in reader.links()}
    assert set(by_name) == {"lo", "up0", "up1", "br0"}
    assert {n: l.ifindex for n, l in by_name.items()} == IDX
    up0, up1, br0, lo = by_name["up0"], by_name["up1"], by_name["br0"], by_name["lo"]
    assert (up0.kind, up0.mtu, up0.up) == ("veth", 9000, True)
    assert (up1.kind, up1.mtu, up1.up) == ("veth", 1500, True)
    assert (br0.kind, br0.mtu, br0.up) == ("bridge", 1500, True)
    assert (lo.kind, lo.mtu, lo.up) == ("", 65536, True)  # no IFLA_LINKINFO on lo


def test_routes_v4_default_connected_typed_and_multipath():
    reader, _ = reader_on("routes_v4")
    routes = reader.routes(socket.AF_INET)
    assert {r.family for r in routes} == {socket.AF_INET}
    main = [r for r in routes if r.table == RT_TABLE_MAIN]
    (default,) = [r for r in main if r.dst_len == 0]
    assert (default.type, default.oif, default.via_gateway, default.metric) == (RTN_UNICAST, UP0, True, 0)
    # 198.18.0.0/24 on up0 and 198.18.1.0/24 on br0: connected, no gateway.
    connected = sorted((r.oif, r.via_gateway) for r in main if r.dst_len == 24 and r.oif is not None)
    assert connected == sorted([(UP0, False), (BR0, False)])
    # unreachable/prohibit/blackhole routes have no output interface.
    assert sorted(r.type for r in main if r.oif is None and not r.multipath_oifs) == \
        [RTN_BLACKHOLE, RTN_UNREACHABLE, RTN_PROHIBIT]
    (multipath,) = [r for r in main if r.multipath_oifs]
    assert (multipath.dst_len, multipath.oif, multipath.multipath_oifs) == (24, None, (UP0, BR0))
    assert all(r.table == RT_TABLE_LOCAL for r in routes if r not in main)


def test_routes_v6_have_no_default_route():
    reader, _ = reader_on("routes_v6")
    routes = reader.routes(socket.AF_INET6)
    assert {r.family for r in routes} == {socket.AF_INET6}
    assert not [r for r in routes if r.dst_len == 0]
    # 2001:db8::/64 and fe80::/64 on up0, kernel metric 256.
    assert [(r.dst_len, r.metric, r.via_gateway) for r in routes if r.oif == UP0 and r.table == RT_TABLE_MAIN] == \
        [(64, 256, False)] * 2


def test_route_to_on_link_and_via_gateway():
    reader, _ = reader_on("route_to_onlink", "route_to_gateway")
    onlink = reader.route_to("198.18.0.7")
    assert (onlink.family, onlink.dst_len, onlink.oif, onlink.via_gateway) == (socket.AF_INET, 32, UP0, False)
    gateway = reader.route_to("198.19.200.1")
    assert (gateway.oif, gateway.via_gateway) == (UP0, True)
    reader, _ = reader_on("route_to_onlink", "route_to_gateway")
    assert pods.route_oif(reader, "198.18.0.7") == UP0
    assert pods.route_oif(reader, "198.19.200.1") is None  # behind a gateway: not a local endpoint


@pytest.mark.parametrize("name, ip, code", [
    ("route_to_enetunreach", "2001:db8:ffff::1", errno.ENETUNREACH),  # no IPv6 route at all
    ("route_to_ehostunreach", "198.19.3.1", errno.EHOSTUNREACH),  # an 'unreachable' route
])
def test_route_to_without_a_route_is_none(name, ip, code):
    assert reply_errno(name) == code  # what the kernel answered
    reader, sock = reader_on(name)
    assert reader.route_to(ip) is None
    assert len(sock.sent) == 1


@pytest.mark.parametrize("name, ip, code, cause", [
    ("route_to_eacces", "198.19.1.1", errno.EACCES, "Permission denied"),  # a 'prohibit' route
    ("route_to_einval", "198.19.2.1", errno.EINVAL, "Invalid argument"),  # a 'blackhole' route
])
def test_route_to_other_errno_raises(name, ip, code, cause):
    assert reply_errno(name) == code
    reader, _ = reader_on(name)
    with pytest.raises(KernelError) as exc:
        reader.route_to(ip)
    assert exc.value.errno == code
    assert str(exc.value) == f"get route to {ip} on node: {cause}"


def test_route_to_eperm_is_not_no_route():
    """Synthesized: the recorded ENETUNREACH reply with its errno edited to EPERM."""
    (d,) = datagrams("route_to_enetunreach")
    edited = with_errno(d, errno.EPERM, lambda m: m.type == nlmsg.NLMSG_ERROR)
    reader = RtnlReader(sock=RecordedSocket([edited]), timeout_s=0.25)
    with pytest.raises(KernelError) as exc:
        reader.route_to("2001:db8:ffff::1")
    assert exc.value.errno == errno.EPERM
    assert str(exc.value) == "get route to 2001:db8:ffff::1 on node: Operation not permitted"


# -- neighbours ------------------------------------------------------------------------------------
def test_neighbours_and_fdb_find_the_bridge_port():
    # The kernel ignores ndm_ifindex in a dump request: the recorded reply holds up0's entry too.
    recorded = [rows.neigh(d, m) for d in datagrams("neighbours_v4") for m in nlmsg.messages(d)
                if m.type == RTM_NEWNEIGH]
    assert (UP0, socket.inet_aton("198.18.0.2")) in {(n.ifindex, n.dst) for n in recorded}
    reader, _ = reader_on("neighbours_v4")
    on_br0 = reader.neighbours(socket.AF_INET, BR0, "br0")
    assert on_br0 and {n.ifindex for n in on_br0} == {BR0}
    (entry,) = [n for n in on_br0 if n.dst == socket.inet_aton("198.18.1.2")]
    assert (entry.family, entry.lladdr, entry.master) == (socket.AF_INET, bytes.fromhex("020000000102"), None)

    reader, _ = reader_on("fdb")
    (fdb,) = [n for n in reader.neighbours(socket.AF_BRIDGE) if n.lladdr == bytes.fromhex("020000000102")]
    assert (fdb.family, fdb.ifindex, fdb.master, fdb.dst) == (socket.AF_BRIDGE, UP1, BR0, None)

    reader, _ = reader_on("neighbours_v4", "fdb")
    assert pods.bridge_port_of(reader, BR0, "198.18.1.2") == UP1


# -- tc --------------------------------------------------------------------------------------------
def test_qdiscs_kinds_handles_parents_limits():
    reader, _ = reader_on("qdiscs")
    q = {(r.ifindex, r.handle): r for r in reader.qdiscs()}
    htb = q[(UP0, HTB_ROOT)]
    assert (htb.kind, htb.parent, htb.default_minor) == ("htb", TC_H_ROOT, 0x10)  # "default 10" is hex
    bfifo = q[(UP0, classid(0x10, 0))]
    assert (bfifo.kind, bfifo.parent, bfifo.limit) == ("bfifo", classid(0x7368, 0x10), 100_000)  # bytes
    pfifo = q[(UP0, classid(0x20, 0))]
    assert (pfifo.kind, pfifo.parent, pfifo.limit) == ("pfifo", classid(0x7368, 0x20), 50)  # packets
    leaves = {r.kind for r in q.values() if r.ifindex == UP0 and r.parent != TC_H_ROOT}
    if META["optional"]["fq_codel"]:
        fq = q[(UP0, classid(0x30, 0))]
        assert (fq.kind, fq.parent, fq.limit) == ("fq_codel", classid(0x7368, 0x30), 1000)
        assert leaves == {"bfifo", "pfifo", "fq_codel"}
    else:
        assert leaves == {"bfifo", "pfifo"}
    for idx in (LO, UP1, BR0):
        assert [(r.kind, r.parent) for r in q.values() if r.ifindex == idx] == [("noqueue", TC_H_ROOT)]
    # The kernel dumps every device's qdiscs whatever tcm_ifindex says; the reader keeps up0's.
    reader, _ = reader_on("qdiscs", same_request=False)
    assert {r.ifindex for r in reader.qdiscs(UP0, "up0")} == {UP0}


def test_htb_classes_64bit_rates_exactly():
    reader, _ = reader_on("htb_classes")
    classes = {c.classid: c for c in reader.htb_classes(UP0, "up0")}
    assert set(classes) == {classid(0x7368, m) for m in (0x1, 0x10, 0x20, 0x30)}
    root, big, small, mid = (classes[classid(0x7368, m)] for m in (0x1, 0x10, 0x20, 0x30))
    # 40gbit / 60gbit = 5e9 / 7.5e9 bytes/s: above 2^32, only in TCA_HTB_RATE64 / TCA_HTB_CEIL64.
    for c in (root, big):
        assert (c.rate_Bps, c.ceil_Bps, c.quantum_bytes) == (5_000_000_000, 7_500_000_000, 60_000)
        assert c.rate_Bps > 2**32 and c.ceil_Bps > 2**32
    assert (root.parent, root.leaf_handle, root.prio) == (TC_H_ROOT, 0, 0)
    assert (big.parent, big.leaf_handle, big.prio) == (classid(0x7368, 1), classid(0x10, 0), 1)
    assert (small.rate_Bps, small.ceil_Bps, small.prio) == (125_000, 250_000, 3)  # 1mbit / 2mbit
    assert (small.parent, small.leaf_handle) == (classid(0x7368, 1), classid(0x20, 0))
    assert (mid.rate_Bps, mid.ceil_Bps, mid.leaf_handle) == (1_000_000, 1_000_000, 0)  # 8mbit, no leaf qdisc
    for c in classes.values():
        assert c.ifindex == UP0
        assert c.buffer_ticks > 0 and c.cbuffer_ticks > 0
        assert min(c.bytes, c.packets, c.drops, c.overlimits, c.backlog_bytes, c.qlen) >= 0
    # A smaller burst at a higher rate is fewer ticks: 100k at 40gbit vs tc's default burst at 1mbit.
    assert big.buffer_ticks < small.buffer_ticks


def test_filters_u32_keys_and_bpf_names():
    reader, _ = reader_on("filters")
    filters = {f.prio: f for f in reader.filters(UP0, HTB_ROOT, "up0")}
    # u32 hash tables (800:, 801:, 802:) and chain heads (handle 0) are structure, not rows.
    assert sorted(filters) == [1, 2, 3, 10, 11]
    assert {(f.ifindex, f.parent) for f in filters.values()} == {(UP0, HTB_ROOT)}

    v4 = filters[1]  # match ip src 198.18.1.0/24 flowid 7368:10
    assert (v4.kind, v4.protocol, v4.classid) == ("u32", ETH_P_IP, classid(0x7368, 0x10))
    assert v4.keys == (U32KeyRow(value=0xC6120100, mask=0xFFFFFF00, offset=12),)
    v6 = filters[2]  # match ip6 src 2001:db8:1::/48 flowid 7368:20
    assert (v6.kind, v6.protocol, v6.classid) == ("u32", ETH_P_IPV6, classid(0x7368, 0x20))
    assert v6.keys == (U32KeyRow(value=0x20010DB8, mask=0xFFFFFFFF, offset=8),
                       U32KeyRow(value=0x00010000, mask=0xFFFF0000, offset=12))
    for f in (v4, v6):
        assert f.mark is None and f.handle & 0xFFF == 0x800  # the first node of its hash table

    mark = filters[3]  # match mark 0x5 0xff flowid 7368:30
    assert (mark.kind, mark.protocol, mark.classid, mark.keys) == ("u32", ETH_P_IP, classid(0x7368, 0x30), ())
    # Kernels without CONFIG_CLS_U32_MARK accept the match and drop it (recording.json says which).
    assert mark.mark == ((0x5, 0xFF) if META["optional"]["u32_mark"] else None)

    classic = filters[10]  # bpf bytecode '1,6 0 0 0' classid 7368:30
    assert (classic.kind, classic.protocol, classic.handle) == ("bpf", ETH_P_ALL, 1)
    assert (classic.classid, classic.name) == (classid(0x7368, 0x30), "")  # cBPF: no TCA_BPF_NAME
    ebpf = filters[11]  # shaperd's classifier, attached with its name as kernel/tc.py does
    assert (ebpf.kind, ebpf.protocol, ebpf.classid) == ("bpf", ETH_P_ALL, classid(0x7368, 0x10))
    assert ebpf.name == META["ebpf_filter"]["name"] == bpf.program_name({1: 0x73680010, 2: 0x73680020})


def test_absent_device_or_parent_is_an_empty_dump():
    """What the kernel answers (recorded): a clean, empty dump, not an error reply."""
    assert reply_errno("classes_missing_ifindex") == 0 and reply_errno("filters_missing_parent") == 0
    reader, _ = reader_on("classes_missing_ifindex", "filters_missing_parent")
    assert reader.htb_classes(99999, "if99999") == []
    assert reader.filters(UP0, 0x12340000, "up0") == []


# -- errors, interrupted dumps, deadlines ----------------------------------------------------------
def test_dump_error_reply_raises_naming_the_read():
    """Recorded: a dump the kernel cannot start (RTM_GETDCB, no dump handler) is an NLMSG_ERROR;
    served here as the answer to a class dump, as any dump the kernel refuses would be."""
    assert fixture("error_dump_nlmsgerr")["serve_as"] == "htb_classes(up0)"
    assert reply_errno("error_dump_nlmsgerr") == errno.EOPNOTSUPP
    reader, _ = reader_on("error_dump_nlmsgerr")
    with pytest.raises(KernelError) as exc:
        reader.htb_classes(UP0, "up0")
    assert exc.value.errno == errno.EOPNOTSUPP
    assert str(exc.value) == "dump classes on up0: Operation not supported"


def test_dump_failed_once_started_raises():
    """Recorded: a dump the kernel fails after starting it ends in an NLMSG_DONE carrying the errno,
    not an NLMSG_ERROR (this one: a filter dump whose TCA_CHAIN is 1 byte, ERANGE). It used to be
    read as a complete, empty dump."""
    assert fixture("error_dump_done")["serve_as"] == "filters(up0, 7368:)"
    (d,) = datagrams("error_dump_done")
    assert [m.type for m in nlmsg.messages(d)] == [nlmsg.NLMSG_DONE]
    assert reply_errno("error_dump_done") == errno.ERANGE
    reader, _ = reader_on("error_dump_done")
    with pytest.raises(KernelError) as exc:
        reader.filters(UP0, HTB_ROOT, "up0")
    assert exc.value.errno == errno.ERANGE
    assert str(exc.value) == "dump filters on up0: Numerical result out of range"


def test_dump_failed_after_rows_raises_rather_than_returning_part():
    """Synthesized: the recorded class dump with its NLMSG_DONE errno edited to EMSGSIZE (what a
    row too large for the dump buffer gives): the rows before it are not a full answer."""
    ds = [with_errno(d, errno.EMSGSIZE, lambda m: m.type == nlmsg.NLMSG_DONE) for d in datagrams("htb_classes")]
    reader = RtnlReader(sock=RecordedSocket(ds), timeout_s=0.25)
    with pytest.raises(KernelError) as exc:
        reader.htb_classes(UP0, "up0")
    assert exc.value.errno == errno.EMSGSIZE and str(exc.value).startswith("dump classes on up0: ")


def interrupted_reply(name: str, where: str) -> list[bytes]:
    """A recorded dump with NLM_F_DUMP_INTR set, as the kernel sets it when the table changed mid-dump.

    The kernel cannot be made to interrupt a dump on demand, so the flag is set by hand: on the
    first row, or on the NLMSG_DONE (nl_dump_check_consistent marks whichever message it is
    writing when it notices the change)."""
    ds = datagrams(name)
    if where == "done":
        return [with_flags(d, nlmsg.NLM_F_DUMP_INTR, lambda m: m.type == nlmsg.NLMSG_DONE) for d in ds]
    first = next(nlmsg.messages(ds[0]))
    assert first.type not in (nlmsg.NLMSG_DONE, nlmsg.NLMSG_ERROR)
    return [with_flags(ds[0], nlmsg.NLM_F_DUMP_INTR, lambda m: m.start == first.start), *ds[1:]]


@pytest.mark.parametrize("where", ["first row", "done"])
def test_interrupted_dump_is_read_again(where):
    clean, _ = reader_on("htb_classes")
    want = clean.htb_classes(UP0, "up0")
    sock = RecordedSocket(interrupted_reply("htb_classes", where), datagrams("htb_classes"))
    reader = RtnlReader(sock=sock, timeout_s=0.25)
    assert reader.htb_classes(UP0, "up0") == want and len(want) == 4
    assert len(sock.sent) == 2  # the request, and the same request again
    assert [without_seq(s) for s in sock.sent] == [without_seq(sock.sent[0])] * 2
    assert nlmsg.HDR.unpack_from(sock.sent[0])[3] != nlmsg.HDR.unpack_from(sock.sent[1])[3]


def test_dump_interrupted_every_time_raises():
    replies = [interrupted_reply("htb_classes", "first row") for _ in range(rtnl.DUMP_ATTEMPTS)]
    sock = RecordedSocket(*replies)
    reader = RtnlReader(sock=sock, timeout_s=0.25)
    with pytest.raises(KernelError) as exc:
        reader.htb_classes(UP0, "up0")
    assert exc.value.errno == errno.EINTR
    assert "interrupted" in str(exc.value) and str(exc.value).startswith("dump classes on up0: ")
    assert len(sock.sent) == rtnl.DUMP_ATTEMPTS


class SilentSocket(RecordedSocket):
    def recv(self, bufsize: int) -> bytes:
        raise socket.timeout("timed out")


def test_no_answer_within_the_deadline_raises():
    sock = SilentSocket([])
    reader = RtnlReader(sock=sock, timeout_s=0.25)
    assert sock.timeout_s == 0.25
    with pytest.raises(KernelError) as exc:
        reader.links()
    assert exc.value.errno == errno.ETIMEDOUT
    assert str(exc.value) == "read links on node: no answer from the kernel within 0.25 s"


def test_every_fixture_is_recorded_and_named_in_the_readme():
    readme = (FIXTURES / "README").read_text()
    assert "tests/unit/fixtures/netlink/record.py" in readme and META["kernel"] in readme
    for path in FIXTURES.glob("*.json"):
        if path.name != "recording.json":
            doc = json.loads(path.read_text())
            assert doc["datagrams"] and len(doc["sent"]) == 1, path.name
