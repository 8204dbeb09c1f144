"""devlink rate objects over generic netlink: read the rate tree, create/set/delete nodes, parent leaves.

pyroute2 0.9 has no devlink rate commands, so the messages are hand-built
here, as iproute2's ``devlink port function rate`` builds them (same
command, flags, attribute order and encodings, byte for byte; tests/unit/
test_devlink_nl.py checks them against bytes recorded from the real tool).
Constants are the kernel's include/uapi/linux/devlink.h (ABI: enum order is
fixed). A generic netlink message is the netlink header, then
``struct genlmsghdr {u8 cmd; u8 version; u16 reserved}``, then attributes.
The family id is the kernel's choice: it is resolved once with
CTRL_CMD_GETFAMILY (the nlctrl family, id 0x10), as the tool does.

Units: devlink carries rates in **bytes per second** (u64). Callers pass
``*_Bps`` values; iproute2's CLI takes bit units (``10mbit`` = 1250000 B/s).

A kernel without the devlink family answers CTRL_CMD_GETFAMILY with ENOENT:
that is ``DevlinkAbsent``. A driver without rate support answers a write
with EOPNOTSUPP (``RateUnsupported``); a devlink device that does not exist
answers ENODEV (``NoDevlinkDevice``). Every exchange has one deadline for
the whole answer; an interrupted dump is read again; the kernel's extended
ack message (e.g. "Node has children") is kept in the error. No policy here:
what to write is decided by shaperd/backends/devlink/.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.nlexchange import NetlinkExchange, open_netlink
from shaperd.kernel.nlmsg import Message

NETLINK_GENERIC = 16
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
NLMSGERR_ATTR_MSG = 1

GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
CTRL_VERSION = 1  # what iproute2's mnlg sends in the genlmsghdr of CTRL_CMD_GETFAMILY

FAMILY = "devlink"
DEVLINK_GENL_VERSION = 1
# genlmsghdr.version as iproute2 6.1's devlink sends it (recorded: 0, not DEVLINK_GENL_VERSION; the
# kernel does not check it). Sent the same, so the bytes match the tool's.
VERSION = 0
GENL = struct.Struct("=BBH")  # struct genlmsghdr
U16 = struct.Struct("=H")

# enum devlink_command
CMD_PORT_GET = 5
CMD_RATE_GET, CMD_RATE_SET, CMD_RATE_NEW, CMD_RATE_DEL = 74, 75, 76, 77
# enum devlink_attr
ATTR_BUS_NAME, ATTR_DEV_NAME, ATTR_PORT_INDEX = 1, 2, 3
ATTR_PORT_NETDEV_NAME = 7
ATTR_PORT_FLAVOUR, ATTR_PORT_NUMBER = 77, 78
ATTR_PORT_PCI_PF_NUMBER, ATTR_PORT_PCI_VF_NUMBER = 127, 128
ATTR_PORT_CONTROLLER_NUMBER = 150
ATTR_PORT_PCI_SF_NUMBER = 164
ATTR_RATE_TYPE, ATTR_RATE_TX_SHARE, ATTR_RATE_TX_MAX = 165, 166, 167
ATTR_RATE_NODE_NAME, ATTR_RATE_PARENT_NODE_NAME = 168, 169
# enum devlink_rate_type
RATE_TYPE_LEAF, RATE_TYPE_NODE = 0, 1
# enum devlink_port_flavour
PORT_FLAVOUR_PCI_PF, PORT_FLAVOUR_PCI_VF, PORT_FLAVOUR_PCI_SF = 3, 4, 7

DEFAULT_TIMEOUT_S = 5.0
DUMP_ATTEMPTS = 4

T = TypeVar("T")


class DevlinkAbsent(KernelError):
    """This kernel has no devlink generic netlink family: no devlink device, no rate object can exist here."""


class NoDevlinkDevice(KernelError):
    """The devlink device named does not exist (ENODEV)."""


class RateUnsupported(KernelError):
    """The devlink device's driver has no rate support, or not in its current mode (EOPNOTSUPP)."""


# -- requests (pure) -------------------------------------------------------------------------------

def _strz(typ: int, s: str) -> bytes:
    return nlmsg.rta(typ, s.encode() + b"\0")


def _u32(typ: int, v: int) -> bytes:
    return nlmsg.rta(typ, nlmsg.U32.pack(v))


def _u64(typ: int, v: int) -> bytes:
    # libmnl's mnl_attr_put_u64 puts the value right after the 4-byte header (no DEVLINK_ATTR_PAD):
    # the kernel accepts an unaligned NLA_U64, and iproute2 sends it that way.
    return nlmsg.rta(typ, nlmsg.U64.pack(v))


def genl_message(family: int, cmd: int, seq: int, body: bytes, *, dump: bool = False,
                 version: int = VERSION) -> bytes:
    flags = nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_ACK | (nlmsg.NLM_F_DUMP if dump else 0)
    payload = GENL.pack(cmd, version, 0) + body
    return nlmsg.header(nlmsg.HDR.size + len(payload), family, flags, seq) + payload


def getfamily_request(seq: int, name: str = FAMILY) -> bytes:
    return genl_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, seq, _strz(CTRL_ATTR_FAMILY_NAME, name),
                        version=CTRL_VERSION)


def split_instance(instance: str) -> tuple[str, str]:
    """'pci/0000:3b:00.0' -> ('pci', '0000:3b:00.0')."""
    bus, sep, dev = instance.partition("/")
    if not sep or not bus or not dev or "/" in dev:
        raise ValueError(f"devlink device {instance!r}: expected BUS/DEVICE, e.g. pci/0000:3b:00.0")
    return bus, dev


def _rates(tx_share_Bps: int | None, tx_max_Bps: int | None, parent: str | None) -> bytes:
    body = b""
    if tx_share_Bps is not None:
        body += _u64(ATTR_RATE_TX_SHARE, tx_share_Bps)
    if tx_max_Bps is not None:
        body += _u64(ATTR_RATE_TX_MAX, tx_max_Bps)
    if parent is not None:  # "" is "noparent"
        body += _strz(ATTR_RATE_PARENT_NODE_NAME, parent)
    return body


def _node_handle(instance: str, node: str) -> bytes:
    bus, dev = split_instance(instance)
    return _strz(ATTR_BUS_NAME, bus) + _strz(ATTR_DEV_NAME, dev) + _strz(ATTR_RATE_NODE_NAME, node)


def _leaf_handle(instance: str, port_index: int) -> bytes:
    bus, dev = split_instance(instance)
    return _strz(ATTR_BUS_NAME, bus) + _strz(ATTR_DEV_NAME, dev) + _u32(ATTR_PORT_INDEX, port_index)


def rate_new(family: int, seq: int, instance: str, node: str, *, tx_share_Bps: int | None = None,
             tx_max_Bps: int | None = None, parent: str | None = None) -> bytes:
    """DEVLINK_CMD_RATE_NEW: ``devlink port function rate add INSTANCE/NODE [tx_share ..] [tx_max ..]``."""
    return genl_message(family, CMD_RATE_NEW, seq, _node_handle(instance, node) +
                        _rates(tx_share_Bps, tx_max_Bps, parent))


def rate_set_node(family: int, seq: int, instance: str, node: str, *, tx_share_Bps: int | None = None,
                  tx_max_Bps: int | None = None, parent: str | None = None) -> bytes:
    return genl_message(family, CMD_RATE_SET, seq, _node_handle(instance, node) +
                        _rates(tx_share_Bps, tx_max_Bps, parent))


def rate_set_leaf(family: int, seq: int, instance: str, port_index: int, *, tx_share_Bps: int | None = None,
                  tx_max_Bps: int | None = None, parent: str | None = None) -> bytes:
    """DEVLINK_CMD_RATE_SET on a port's leaf; ``parent=""`` is ``noparent``."""
    return genl_message(family, CMD_RATE_SET, seq, _leaf_handle(instance, port_index) +
                        _rates(tx_share_Bps, tx_max_Bps, parent))


def rate_del(family: int, seq: int, instance: str, node: str) -> bytes:
    return genl_message(family, CMD_RATE_DEL, seq, _node_handle(instance, node))


def rate_dump(family: int, seq: int) -> bytes:
    return genl_message(family, CMD_RATE_GET, seq, b"", dump=True)


def port_dump(family: int, seq: int) -> bytes:
    return genl_message(family, CMD_PORT_GET, seq, b"", dump=True)


# -- rows ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RateRow:
    """One rate object: a leaf (a port's; ``port_index``) or a node (``node``), rates in bytes/s (0: unset)."""

    instance: str  # "pci/0000:3b:00.0"
    type: int
    port_index: int | None = None
    node: str | None = None
    tx_share_Bps: int = 0
    tx_max_Bps: int = 0
    parent: str | None = None

    @property
    def is_node(self) -> bool:
        return self.type == RATE_TYPE_NODE

    @property
    def handle(self) -> str:
        return f"{self.instance}/{self.node if self.is_node else self.port_index}"


@dataclass(frozen=True)
class PortRow:
    instance: str
    index: int
    flavour: int | None = None
    pf: int | None = None
    vf: int | None = None
    sf: int | None = None
    controller: int | None = None
    netdev: str | None = None

    @property
    def handle(self) -> str:
        return f"{self.instance}/{self.index}"


def _where(msg: Message) -> str:
    return f"devlink message type {msg.type:#x} seq {msg.seq}"


def _attrs(buf: bytes, msg: Message) -> dict[int, tuple[int, int]]:
    return nlmsg.attrs(buf, msg.start + GENL.size, msg.end)


def _instance(buf: bytes, msg: Message, a: dict) -> str:
    if ATTR_BUS_NAME not in a or ATTR_DEV_NAME not in a:
        raise KernelError("decode", "devlink reply", _where(msg), "no bus or device name attribute",
                          errno_mod.EBADMSG)
    return f"{nlmsg.string(buf, a[ATTR_BUS_NAME])}/{nlmsg.string(buf, a[ATTR_DEV_NAME])}"


def _u16(buf: bytes, span) -> int | None:
    if span is None or span[1] - span[0] < 2:
        return None
    return U16.unpack_from(buf, span[0])[0]


def decode_rate(buf: bytes, msg: Message) -> RateRow:
    a = _attrs(buf, msg)
    inst = _instance(buf, msg, a)
    typ = _u16(buf, a.get(ATTR_RATE_TYPE))
    node = nlmsg.string(buf, a.get(ATTR_RATE_NODE_NAME)) if ATTR_RATE_NODE_NAME in a else None
    port = nlmsg.u32(buf, a[ATTR_PORT_INDEX]) if ATTR_PORT_INDEX in a else None
    if typ is None:
        typ = RATE_TYPE_NODE if node is not None else RATE_TYPE_LEAF
    if (typ == RATE_TYPE_NODE and not node) or (typ == RATE_TYPE_LEAF and port is None):
        raise KernelError("decode", "devlink rate reply", f"{inst} ({_where(msg)})",
                          "a node without a name or a leaf without a port index", errno_mod.EBADMSG)
    parent = nlmsg.string(buf, a.get(ATTR_RATE_PARENT_NODE_NAME)) if ATTR_RATE_PARENT_NODE_NAME in a else None
    return RateRow(inst, typ, port_index=port if typ == RATE_TYPE_LEAF else None,
                   node=node if typ == RATE_TYPE_NODE else None, tx_share_Bps=nlmsg.u64(buf, a.get(ATTR_RATE_TX_SHARE)),
                   tx_max_Bps=nlmsg.u64(buf, a.get(ATTR_RATE_TX_MAX)), parent=parent or None)


def decode_port(buf: bytes, msg: Message) -> PortRow:
    a = _attrs(buf, msg)
    inst = _instance(buf, msg, a)
    if ATTR_PORT_INDEX not in a:
        raise KernelError("decode", "devlink port reply", f"{inst} ({_where(msg)})", "no port index attribute",
                          errno_mod.EBADMSG)
    sf = a.get(ATTR_PORT_PCI_SF_NUMBER)
    ctl = a.get(ATTR_PORT_CONTROLLER_NUMBER)
    return PortRow(inst, nlmsg.u32(buf, a[ATTR_PORT_INDEX]), flavour=_u16(buf, a.get(ATTR_PORT_FLAVOUR)),
                   pf=_u16(buf, a.get(ATTR_PORT_PCI_PF_NUMBER)), vf=_u16(buf, a.get(ATTR_PORT_PCI_VF_NUMBER)),
                   sf=None if sf is None else nlmsg.u32(buf, sf), controller=None if ctl is None else nlmsg.u32(buf, ctl),
                   netdev=nlmsg.string(buf, a.get(ATTR_PORT_NETDEV_NAME)) or None)


def decode_family_id(buf: bytes, msg: Message) -> int:
    a = nlmsg.attrs(buf, msg.start + GENL.size, msg.end)
    fid = _u16(buf, a.get(CTRL_ATTR_FAMILY_ID))
    if fid is None:
        raise KernelError("decode", "generic netlink family reply", _where(msg), "no family id", errno_mod.EBADMSG)
    return fid


def ack_message(buf: bytes, msg: Message) -> str:
    """The kernel's extended-ack text of an NLMSG_ERROR (NETLINK_EXT_ACK), or ''."""
    if not msg.flags & NLM_F_ACK_TLVS:
        return ""
    off = msg.start + 4
    if off + nlmsg.HDR.size > msg.end:
        return ""
    orig_len = nlmsg.HDR.unpack_from(buf, off)[0]
    off += nlmsg.HDR.size if msg.flags & NLM_F_CAPPED else (orig_len + 3) & ~3
    return nlmsg.string(buf, nlmsg.attrs(buf, off, msg.end).get(NLMSGERR_ATTR_MSG))


def error(verb: str, what: str, where: str, code: int, detail: str = "") -> KernelError:
    """The one mapping from an errno the kernel answered to a typed error."""
    cause = os.strerror(code) + (f" ({detail})" if detail else "")
    cls = {errno_mod.ENODEV: NoDevlinkDevice, errno_mod.EOPNOTSUPP: RateUnsupported}.get(code, KernelError)
    return cls(verb, what, where, cause, code)


# -- the socket ------------------------------------------------------------------------------------

def open_socket(netns: str | None = None, run_root: str = "/run") -> socket.socket:
    return open_netlink(NETLINK_GENERIC, "generic netlink socket", netns, run_root, ext_ack=True)


class GenlExchange(NetlinkExchange):
    """One generic netlink socket and its family id, resolved by name once (``FAMILY``), for devlink and
    ethtool (kernel/ethtool_features.py). ``sock`` and ``clock`` are injectable for tests; subclasses say
    what a missing family (``absent``) and a refused lookup (``failed``) are."""

    FAMILY = ""
    DEFAULT_TIMEOUT_S = 5.0

    def __init__(self, netns: str | None = None, *, sock=None, timeout_s: float | None = None,
                 run_root: str = "/run", clock: Callable[[], float] = time.monotonic, seq: int = 0,
                 family: int | None = None):
        super().__init__(sock if sock is not None else open_socket(netns, run_root), netns or "node",
                         self.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, clock, seq)
        self._family = family

    def absent(self, what: str, code: int) -> KernelError:
        return KernelError("resolve", what, self.where, f"the kernel has no {self.FAMILY} family", code)

    def failed(self, what: str, code: int, text: str) -> KernelError:
        return error("resolve", what, self.where, code, text)

    def family(self) -> int:
        """The family id (CTRL_CMD_GETFAMILY by name, once); ``absent`` where the kernel has no such family."""
        if self._family is not None:
            return self._family
        fid = None
        what = f"generic netlink family {self.FAMILY}"
        for buf, m in self._replies(lambda s: getfamily_request(s, self.FAMILY), what):
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                if code == errno_mod.ENOENT:
                    raise self.absent(what, code)
                if code:
                    raise self.failed(what, code, ack_message(buf, m))
                break
            if m.type == GENL_ID_CTRL and fid is None:
                fid = decode_family_id(buf, m)
        if fid is None:
            raise KernelError("resolve", what, self.where, "acked without an answer", errno_mod.EBADMSG)
        self._family = fid
        return fid


class DevlinkNl(GenlExchange):
    """Rate reads and writes over one generic netlink socket."""

    FAMILY = FAMILY
    DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT_S

    def absent(self, what: str, code: int) -> KernelError:
        return DevlinkAbsent("resolve", what, self.where, "the kernel has no devlink family (no devlink device, no "
                             "rate group can exist here)", code)

    def _dump(self, build: Callable[[int, int], bytes], decode: Callable[[bytes, Message], T], what: str) -> list[T]:
        fam = self.family()
        for _attempt in range(DUMP_ATTEMPTS):
            out: list[T] = []
            interrupted = False
            for buf, m in self._replies(lambda s: build(fam, s), what):
                interrupted |= bool(m.flags & nlmsg.NLM_F_DUMP_INTR)
                if m.type == nlmsg.NLMSG_ERROR:
                    code = nlmsg.error_code(buf, m)
                    if code:
                        raise error("dump", what, self.where, code, ack_message(buf, m))
                elif m.type == nlmsg.NLMSG_DONE:
                    code = nlmsg.error_code(buf, m)
                    if code:
                        raise error("dump", what, self.where, code)
                elif m.type == fam:
                    out.append(decode(buf, m))
            if not interrupted:
                return out
        raise KernelError("dump", what, self.where, f"interrupted {DUMP_ATTEMPTS} times in a row (rate objects "
                          "kept changing)", errno_mod.EINTR)

    def _write(self, build: Callable[[int, int], bytes], verb: str, what: str, instance: str) -> None:
        fam = self.family()
        for buf, m in self._replies(lambda s: build(fam, s), f"{what} on {instance}"):
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                if code:
                    raise error(verb, what, instance, code, ack_message(buf, m))
                return
        raise KernelError(verb, what, instance, "no acknowledgement", errno_mod.EBADMSG)  # pragma: no cover

    # -- reads -----------------------------------------------------------------
    def rates(self) -> list[RateRow]:
        """Every rate object of every devlink device in this namespace (empty where there is none)."""
        return self._dump(rate_dump, decode_rate, "devlink rate objects")

    def ports(self) -> list[PortRow]:
        return self._dump(port_dump, decode_port, "devlink ports")

    # -- writes ----------------------------------------------------------------
    def new_node(self, instance: str, node: str, tx_share_Bps: int | None, tx_max_Bps: int | None) -> None:
        self._write(lambda f, s: rate_new(f, s, instance, node, tx_share_Bps=tx_share_Bps, tx_max_Bps=tx_max_Bps),
                    "create", f"rate node {node}", instance)

    def set_node(self, instance: str, node: str, tx_share_Bps: int | None, tx_max_Bps: int | None) -> None:
        self._write(lambda f, s: rate_set_node(f, s, instance, node, tx_share_Bps=tx_share_Bps,
                                               tx_max_Bps=tx_max_Bps), "set", f"rate node {node}", instance)

    def set_leaf_parent(self, instance: str, port_index: int, parent: str) -> None:
        self._write(lambda f, s: rate_set_leaf(f, s, instance, port_index, parent=parent), "set",
                    f"parent of rate leaf {instance}/{port_index}", instance)

    def del_node(self, instance: str, node: str) -> None:
        self._write(lambda f, s: rate_del(f, s, instance, node), "delete", f"rate node {node}", instance)


def probe_answer(netns: str | None = None) -> dict:
    """What this kernel says (for the QEMU recorder and `shaperd` diagnostics): family, rates, a write's refusal."""
    out: dict = {}
    try:
        with DevlinkNl(netns) as nl:
            out["family"] = nl.family()
            out["rates"] = [r.handle for r in nl.rates()]
            try:
                nl.new_node("pci/0000:00:00.0", "shpd_probe", 1000, None)
                out["new_node"] = "created"
            except KernelError as e:
                out["new_node"] = {"type": type(e).__name__, "errno": e.errno, "error": str(e)}
    except KernelError as e:
        out["error"] = {"type": type(e).__name__, "errno": e.errno, "error": str(e)}
    return out
