"""A fake kernel behind shaperd's own netlink sockets, so unit tests can run the real CLI in-process.

Unit tests never reach the host's kernel (tests/unit/conftest.py fails any
that opens a netlink socket). A test that runs a whole command, such as
``shaperd plan``, needs the links and routes of a node all the same:
``FakeKernel.install`` points the two places that open netlink sockets
(kernel/nlexchange.open_netlink, as each client module imported it, and
kernel/nlwriter.open_rtnl_writer) at fake sockets that answer as a kernel
would:

* rtnetlink: the link dump (RTM_GETLINK) and the route dumps (RTM_GETROUTE,
  per address family) of the node the test describes, encoded with
  pyroute2's message classes (an encoder independent of shaperd's
  decoder, which tests/unit/test_rtnl_decode.py checks on recorded kernel
  bytes); tc dumps (qdiscs, classes, filters) answer empty: a bare node;
* generic netlink: CTRL_CMD_GETFAMILY answers with the datagrams a test
  registers for a family (recorded from a real kernel), and ENOENT for any
  other family, laid out as this machine's kernel answered ``devlink``
  (tests/unit/fixtures/devlink/family_absent.strace); requests to a
  registered family id answer with the datagrams registered for its command;
* any other protocol (RDMA netlink): the socket is refused with
  EPROTONOSUPPORT, as a kernel without ib_core refuses it.

Every request is kept in ``requests``; one the fake cannot answer goes to
``unanswered`` (and gets EOPNOTSUPP), so a test asserts it saw all of them.
Replies carry the request's sequence number, as the kernel's do.
"""

from __future__ import annotations

import errno
import importlib
import socket
import struct
import sys
from dataclasses import dataclass, field

from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg

NETLINK_ROUTE, NETLINK_GENERIC = 0, 16
RTM_NEWLINK, RTM_GETLINK, RTM_NEWROUTE, RTM_GETROUTE = 16, 18, 24, 26
RTM_GETQDISC, RTM_GETTCLASS, RTM_GETTFILTER = 38, 42, 46
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 2
NLM_F_CAPPED = 0x100
IFF_UP, IFF_RUNNING, IFF_LOWER_UP = 0x1, 0x40, 0x10000
PORT_ID = 4242  # nlmsg_pid the fake kernel stamps on its replies
CLIENT_MODULES = ("shaperd.kernel.rtnl", "shaperd.kernel.devlink", "shaperd.kernel.rdma_nl",
                  "shaperd.kernel.kind_ask", "shaperd.kernel.events", "shaperd.kernel.ethtool_features")


@dataclass(frozen=True)
class FakeLink:
    name: str
    ifindex: int
    kind: str = ""  # IFLA_INFO_KIND; "" for a physical NIC (no IFLA_LINKINFO)
    mtu: int = 1500
    up: bool = True
    tx_queues: int = 1


@dataclass(frozen=True)
class FakeRoute:
    oif: int
    family: int = socket.AF_INET
    dst: str | None = None  # None: the default route
    dst_len: int = 0
    gateway: str | None = None
    table: int = 254  # RT_TABLE_MAIN
    type: int = 1  # RTN_UNICAST
    metric: int = 0


@dataclass(frozen=True)
class Request:
    protocol: int
    type: int
    flags: int
    seq: int
    body: bytes

    @property
    def genl_cmd(self) -> int:
        return self.body[0] if self.protocol == NETLINK_GENERIC and self.body else -1


def restamp(datagram: bytes, seq: int, pid: int = PORT_ID) -> bytes:
    """``datagram`` with every message's nlmsg_seq (and nlmsg_pid) replaced: the answer to request ``seq``."""
    out = bytearray(datagram)
    for m in nlmsg.messages(datagram):
        struct.pack_into("=II", out, m.start - 8, seq, pid)
    return bytes(out)


def error_reply(req: bytes, code: int) -> bytes:
    """NLMSG_ERROR with -``code`` and the request's header (capped ack), as the kernel sends it."""
    body = struct.pack("=i", -code) + req[:nlmsg.HDR.size]
    seq = nlmsg.HDR.unpack_from(req)[3]
    return struct.pack("=IHHII", nlmsg.HDR.size + len(body), nlmsg.NLMSG_ERROR, NLM_F_CAPPED, seq, PORT_ID) + body


def done(seq: int) -> bytes:
    return struct.pack("=IHHIIi", nlmsg.HDR.size + 4, nlmsg.NLMSG_DONE, nlmsg.NLM_F_MULTI, seq, PORT_ID, 0)


def _encode(msg, typ: int, seq: int) -> bytes:
    msg["header"]["type"] = typ
    msg["header"]["flags"] = nlmsg.NLM_F_MULTI
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = PORT_ID
    msg.encode()
    return bytes(msg.data)


def link_message(link: FakeLink, seq: int) -> bytes:
    m = ifinfmsg()
    m["family"], m["index"], m["change"], m["ifi_type"] = 0, link.ifindex, 0, 1
    m["flags"] = (IFF_UP | IFF_RUNNING | IFF_LOWER_UP) if link.up else 0
    m["attrs"] = [("IFLA_IFNAME", link.name), ("IFLA_MTU", link.mtu), ("IFLA_NUM_TX_QUEUES", link.tx_queues)]
    if link.kind:
        m["attrs"].append(("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", link.kind)]}))
    return _encode(m, RTM_NEWLINK, seq)


def route_message(r: FakeRoute, seq: int) -> bytes:
    m = rtmsg()
    m["family"], m["dst_len"], m["src_len"], m["tos"] = r.family, r.dst_len, 0, 0
    m["table"], m["proto"], m["scope"], m["type"], m["flags"] = min(r.table, 255), 3, 0, r.type, 0
    m["attrs"] = [("RTA_TABLE", r.table), ("RTA_PRIORITY", r.metric), ("RTA_OIF", r.oif)]
    if r.dst is not None:
        m["attrs"].append(("RTA_DST", r.dst))
    if r.gateway is not None:
        m["attrs"].append(("RTA_GATEWAY", r.gateway))
    return _encode(m, RTM_NEWROUTE, seq)


def _family_name(body: bytes) -> str:
    # genlmsghdr (4 bytes), then attributes
    a = nlmsg.attrs(body, 4, len(body))
    return nlmsg.string(body, a.get(CTRL_ATTR_FAMILY_NAME))


@dataclass
class FakeKernel:
    links: tuple[FakeLink, ...] = ()
    routes: tuple[FakeRoute, ...] = ()
    # generic netlink family name -> the datagrams a kernel answered CTRL_CMD_GETFAMILY with (recorded)
    genl_families: dict[str, list[bytes]] = field(default_factory=dict)
    # (family id, genl command) -> the datagrams a kernel answered with (recorded)
    genl_replies: dict[tuple[int, int], list[bytes]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    refused: list[int] = field(default_factory=list)  # protocols whose socket was refused
    sockets: list["FakeSocket"] = field(default_factory=list)  # every socket opened, closed or not

    # -- the kernel's answers ------------------------------------------------------------------------
    def answer(self, protocol: int, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        for m in nlmsg.messages(data):
            req = Request(protocol, m.type, m.flags, m.seq, bytes(data[m.start:m.end]))
            self.requests.append(req)
            out.extend(self._answer(req, bytes(data[m.start - nlmsg.HDR.size:m.end])))
        return out

    def _answer(self, req: Request, raw: bytes) -> list[bytes]:
        seq = req.seq
        dump = req.flags & nlmsg.NLM_F_DUMP == nlmsg.NLM_F_DUMP
        if req.protocol == NETLINK_ROUTE and dump:
            if req.type == RTM_GETLINK:
                return [b"".join(link_message(link, seq) for link in self.links) + done(seq)]
            if req.type == RTM_GETROUTE:
                family = req.body[0] if req.body else socket.AF_UNSPEC
                mine = [r for r in self.routes if family in (socket.AF_UNSPEC, r.family)]
                return [b"".join(route_message(r, seq) for r in mine) + done(seq)]
            if req.type in (RTM_GETQDISC, RTM_GETTCLASS, RTM_GETTFILTER):
                return [done(seq)]  # a bare node: nothing configured
        if req.protocol == NETLINK_GENERIC:
            if req.type == GENL_ID_CTRL and req.genl_cmd == CTRL_CMD_GETFAMILY:
                name = _family_name(req.body)
                if name not in self.genl_families:
                    return [error_reply(raw, errno.ENOENT)]
                return [restamp(d, seq) for d in self.genl_families[name]]
            if (req.type, req.genl_cmd) in self.genl_replies:
                return [restamp(d, seq) for d in self.genl_replies[(req.type, req.genl_cmd)]]
        self.unanswered.append(f"protocol {req.protocol} type {req.type} flags {req.flags:#x} cmd {req.genl_cmd} "
                               f"body {req.body[:32].hex()}")
        return [error_reply(raw, errno.EOPNOTSUPP)]

    # -- the sockets ---------------------------------------------------------------------------------
    def open_netlink(self, protocol: int, label: str, netns: str | None = None, run_root: str = "/run", **_kw):
        """kernel/nlexchange.open_netlink's signature and errors."""
        if protocol not in (NETLINK_ROUTE, NETLINK_GENERIC):
            self.refused.append(protocol)
            raise KernelError("open", label, netns or "this namespace", "Protocol not supported",
                              errno.EPROTONOSUPPORT)
        return self._socket(protocol)

    def open_rtnl_writer(self, netns: str | None = None, run_root: str = "/run"):
        return self._socket(NETLINK_ROUTE)

    def _socket(self, protocol: int) -> "FakeSocket":
        self.sockets.append(FakeSocket(self, protocol))
        return self.sockets[-1]

    def install(self, monkeypatch) -> "FakeKernel":
        from shaperd.kernel import nlexchange, nlwriter

        real = nlexchange.open_netlink
        for name in CLIENT_MODULES:
            importlib.import_module(name)
        for name, mod in list(sys.modules.items()):
            if name.startswith("shaperd.") and getattr(mod, "open_netlink", None) is real:
                monkeypatch.setattr(mod, "open_netlink", self.open_netlink)
        monkeypatch.setattr(nlwriter, "open_rtnl_writer", self.open_rtnl_writer)
        return self


class FakeSocket:
    """The socket methods shaperd's netlink clients use; ``recv`` with nothing queued is a timeout."""

    def __init__(self, kernel: FakeKernel, protocol: int):
        self.kernel, self.protocol = kernel, protocol
        self.queue: list[bytes] = []
        self.closed = False

    def send(self, data: bytes) -> int:
        self.queue.extend(self.kernel.answer(self.protocol, bytes(data)))
        return len(data)

    def recv(self, _n: int) -> bytes:
        if not self.queue:
            raise socket.timeout()
        return self.queue.pop(0)

    def settimeout(self, _t) -> None:
        pass

    def setsockopt(self, *_a) -> None:
        pass

    def getsockopt(self, *_a) -> int:
        return 1 << 20

    def bind(self, _addr) -> None:
        pass

    def fileno(self) -> int:
        raise AssertionError("the fake kernel's sockets cannot be polled: nothing in a unit test should wait on one")

    def close(self) -> None:
        self.closed = True
