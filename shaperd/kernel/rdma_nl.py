"""The RDMA netlink reader: devices, ports, hw counters and the netns mode, as iproute2's ``rdma`` reads them.

One raw NETLINK_RDMA socket (protocol 20; pyroute2 has no RDMA netlink),
created inside the target namespace (kernel/netns.py), sending the nldev
client's requests (message type ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)`` =
``(5 << 10) + op``) and decoding the replies into typed rows. Read-only.

The requests are built as iproute2's ``rdma`` builds them (same command,
flags and attributes, byte for byte; tests/unit/test_rdma_nl.py checks
them against bytes recorded from the real tool). Constants are from the
kernel's include/uapi/rdma/rdma_netlink.h (ABI: the enum order is fixed).

Every exchange has one deadline (``timeout_s``, for the whole answer, not
per datagram); a dump marked NLM_F_DUMP_INTR is read again; an error reply
is a KernelError naming what was read and where. A kernel without RDMA
netlink (ib_core not loaded: no RDMA driver on this node) refuses the socket
with EPROTONOSUPPORT: that is ``RdmaNetlinkAbsent``, a KernelError callers
can tell apart from a failure. A kernel with ib_core and no device answers
a device dump with an empty list. The socket is injectable, so the decoders
run on recorded replies in tests.
"""

from __future__ import annotations

import errno as errno_mod
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.nlexchange import NetlinkExchange, open_netlink
from shaperd.kernel.nlmsg import Message

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
# enum rdma_nldev_command
CMD_GET, CMD_PORT_GET, CMD_SYS_GET, CMD_STAT_GET = 1, 5, 6, 17
# enum rdma_nldev_attr
ATTR_DEV_INDEX, ATTR_DEV_NAME, ATTR_PORT_INDEX, ATTR_CAP_FLAGS, ATTR_FW_VERSION = 1, 2, 3, 4, 5
ATTR_NODE_GUID, ATTR_SYS_IMAGE_GUID, ATTR_SUBNET_PREFIX, ATTR_LID, ATTR_SM_LID, ATTR_LMC = 6, 7, 8, 9, 10, 11
ATTR_PORT_STATE, ATTR_PORT_PHYS_STATE, ATTR_DEV_NODE_TYPE = 12, 13, 14
ATTR_NDEV_INDEX, ATTR_NDEV_NAME = 50, 51
ATTR_SYS_NETNS_MODE, ATTR_DEV_PROTOCOL = 66, 67
ATTR_STAT_HWCOUNTERS, ATTR_STAT_HWCOUNTER_ENTRY = 80, 81
ATTR_STAT_HWCOUNTER_ENTRY_NAME, ATTR_STAT_HWCOUNTER_ENTRY_VALUE = 82, 83

DEFAULT_TIMEOUT_S = 5.0
DUMP_ATTEMPTS = 4
# How the kernel answers a get for a device index or port it does not have (nldev_get_doit,
# nldev_port_get_doit: EINVAL; ENODEV/ENOENT kept for other kernels).
NO_SUCH_DEVICE = frozenset({errno_mod.EINVAL, errno_mod.ENODEV, errno_mod.ENOENT})

# Port states and physical states as sysfs spells them (drivers/infiniband/core/sysfs.c), so the
# two sources compare equal; iproute2 prints the same numbers as ACTIVE / LINK_UP.
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
               6: "LinkErrorRecovery", 7: "Phy Test"}
# RDMA_NLDEV_ATTR_DEV_PROTOCOL (the device's first port) -> the link layer sysfs reports.
LINK_LAYER_BY_PROTOCOL = {"ib": "InfiniBand", "roce": "Ethernet", "iw": "Ethernet", "opa": "InfiniBand"}

T = TypeVar("T")


def msg_type(op: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)."""
    return (RDMA_NL_NLDEV << 10) + op


class RdmaNetlinkAbsent(KernelError):
    """This kernel has no RDMA netlink (the socket is refused): no RDMA devices can exist here."""


# -- requests (pure) -------------------------------------------------------------------------------

def _u32(typ: int, v: int) -> bytes:
    return nlmsg.rta(typ, nlmsg.U32.pack(v))


def request(op: int, seq: int, *, dump: bool = False, dev_index: int | None = None,
            port: int | None = None) -> bytes:
    """One nldev request as iproute2 sends it: NLM_F_REQUEST|NLM_F_ACK (|NLM_F_DUMP), then the ids."""
    body = b""
    if dev_index is not None:
        body += _u32(ATTR_DEV_INDEX, dev_index)
    if port is not None:
        body += _u32(ATTR_PORT_INDEX, port)
    flags = nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_ACK | (nlmsg.NLM_F_DUMP if dump else 0)
    return nlmsg.header(nlmsg.HDR.size + len(body), msg_type(op), flags, seq) + body


# -- rows ------------------------------------------------------------------------------------------

def format_guid(v: int) -> str:
    """A GUID as sysfs prints it: 0x081758fffe65b049 -> '0817:58ff:fe65:b049'."""
    h = f"{v:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class DevRow:
    index: int
    name: str
    node_guid: str | None = None
    sys_image_guid: str | None = None
    fw_version: str | None = None  # None: the driver reports none (rxe)
    node_type: int | None = None  # 1: CA, 2: switch, 3: router, 4: RNIC
    ports: int = 0  # RDMA_NLDEV_ATTR_PORT_INDEX in a device reply: how many ports it has
    protocol: str | None = None  # "ib", "roce", "iw", "opa" (kernels since 5.8)
    cap_flags: int | None = None

    @property
    def link_layer(self) -> str | None:
        return LINK_LAYER_BY_PROTOCOL.get(self.protocol or "")


@dataclass(frozen=True)
class PortRow:
    dev_index: int
    dev_name: str
    port: int
    state: int | None = None
    phys_state: int | None = None
    netdev: str | None = None  # RoCE / iWARP: the netdev under the port
    netdev_index: int | None = None
    lid: int | None = None  # InfiniBand only (the kernel sends LIDs for IB ports only)
    sm_lid: int | None = None
    lmc: int | None = None
    subnet_prefix: int | None = None
    cap_flags: int | None = None

    @property
    def ref(self) -> str:
        return f"{self.dev_name}:{self.port}"

    @property
    def state_name(self) -> str | None:
        return None if self.state is None else PORT_STATES.get(self.state, f"state {self.state}")

    @property
    def phys_state_name(self) -> str | None:
        return None if self.phys_state is None else PHYS_STATES.get(self.phys_state, f"phys state {self.phys_state}")


@dataclass(frozen=True)
class StatRow:
    """A port's default hw counters (RDMA_NLDEV_CMD_STAT_GET without a counter id)."""

    dev_index: int
    dev_name: str
    port: int
    counters: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SysRow:
    netns_mode: int | None = None  # 1: shared (devices visible in every namespace), 0: exclusive

    @property
    def netns_exclusive(self) -> bool | None:
        return None if self.netns_mode is None else self.netns_mode == 0


def _where(msg: Message) -> str:
    return f"RDMA netlink message type {msg.type:#x} seq {msg.seq}"


def _ids(buf: bytes, msg: Message, a: dict) -> tuple[int, str]:
    if ATTR_DEV_INDEX not in a or ATTR_DEV_NAME not in a:
        raise KernelError("decode", "RDMA netlink reply", _where(msg), "no device index or name attribute",
                          errno_mod.EBADMSG)
    return nlmsg.u32(buf, a[ATTR_DEV_INDEX]), nlmsg.string(buf, a[ATTR_DEV_NAME])


def _opt_u32(buf: bytes, span) -> int | None:
    return None if span is None else nlmsg.u32(buf, span)


def _opt_u64(buf: bytes, span) -> int | None:
    return None if span is None else nlmsg.u64(buf, span)


def decode_device(buf: bytes, msg: Message) -> DevRow:
    a = nlmsg.attrs(buf, msg.start, msg.end)
    index, name = _ids(buf, msg, a)
    guid, sysguid = _opt_u64(buf, a.get(ATTR_NODE_GUID)), _opt_u64(buf, a.get(ATTR_SYS_IMAGE_GUID))
    fw = nlmsg.string(buf, a.get(ATTR_FW_VERSION)) if ATTR_FW_VERSION in a else None
    return DevRow(
        index=index, name=name, node_guid=None if guid is None else format_guid(guid),
        sys_image_guid=None if sysguid is None else format_guid(sysguid), fw_version=fw or None,
        node_type=nlmsg.u8(buf, a.get(ATTR_DEV_NODE_TYPE)), ports=nlmsg.u32(buf, a.get(ATTR_PORT_INDEX)),
        protocol=nlmsg.string(buf, a.get(ATTR_DEV_PROTOCOL)) or None, cap_flags=_opt_u64(buf, a.get(ATTR_CAP_FLAGS)),
    )


def decode_port(buf: bytes, msg: Message) -> PortRow:
    a = nlmsg.attrs(buf, msg.start, msg.end)
    index, name = _ids(buf, msg, a)
    if ATTR_PORT_INDEX not in a:
        raise KernelError("decode", "RDMA port reply", f"{name} ({_where(msg)})", "no port index attribute",
                          errno_mod.EBADMSG)
    return PortRow(
        dev_index=index, dev_name=name, port=nlmsg.u32(buf, a[ATTR_PORT_INDEX]),
        state=nlmsg.u8(buf, a.get(ATTR_PORT_STATE)), phys_state=nlmsg.u8(buf, a.get(ATTR_PORT_PHYS_STATE)),
        netdev=nlmsg.string(buf, a.get(ATTR_NDEV_NAME)) or None, netdev_index=_opt_u32(buf, a.get(ATTR_NDEV_INDEX)),
        lid=_opt_u32(buf, a.get(ATTR_LID)), sm_lid=_opt_u32(buf, a.get(ATTR_SM_LID)),
        lmc=nlmsg.u8(buf, a.get(ATTR_LMC)), subnet_prefix=_opt_u64(buf, a.get(ATTR_SUBNET_PREFIX)),
        cap_flags=_opt_u64(buf, a.get(ATTR_CAP_FLAGS)),
    )


def decode_stat(buf: bytes, msg: Message) -> StatRow:
    a = nlmsg.attrs(buf, msg.start, msg.end)
    index, name = _ids(buf, msg, a)
    counters: dict[str, int] = {}
    nest = a.get(ATTR_STAT_HWCOUNTERS)
    if nest is not None:
        for typ, span in nlmsg.attr_list(buf, nest[0], nest[1]):
            if typ != ATTR_STAT_HWCOUNTER_ENTRY:
                continue
            e = nlmsg.attrs(buf, span[0], span[1])
            if ATTR_STAT_HWCOUNTER_ENTRY_NAME not in e or ATTR_STAT_HWCOUNTER_ENTRY_VALUE not in e:
                raise KernelError("decode", "RDMA hw counter entry", f"{name} ({_where(msg)})",
                                  "an entry without a name or a value", errno_mod.EBADMSG)
            counters[nlmsg.string(buf, e[ATTR_STAT_HWCOUNTER_ENTRY_NAME])] = \
                nlmsg.u64(buf, e[ATTR_STAT_HWCOUNTER_ENTRY_VALUE])
    return StatRow(index, name, nlmsg.u32(buf, a.get(ATTR_PORT_INDEX)), counters)


def decode_sys(buf: bytes, msg: Message) -> SysRow:
    a = nlmsg.attrs(buf, msg.start, msg.end)
    return SysRow(nlmsg.u8(buf, a.get(ATTR_SYS_NETNS_MODE)))


# -- the socket ------------------------------------------------------------------------------------

def open_socket(netns: str | None = None, run_root: str = "/run") -> socket.socket:
    """A NETLINK_RDMA socket in ``netns``; RdmaNetlinkAbsent where the kernel has no RDMA netlink."""
    try:
        return open_netlink(NETLINK_RDMA, "RDMA netlink socket", netns, run_root)
    except KernelError as e:
        if e.errno == errno_mod.EPROTONOSUPPORT and e.verb == "open":
            raise RdmaNetlinkAbsent("open", "RDMA netlink socket", netns or "this namespace",
                                    "the kernel has no RDMA netlink (ib_core is not loaded, so no RDMA "
                                    "device is present)", e.errno) from e
        raise


class RdmaNlReader(NetlinkExchange):
    """Typed reads over one NETLINK_RDMA socket (``sock`` and ``clock`` injectable for tests)."""

    def __init__(self, netns: str | None = None, *, sock=None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 run_root: str = "/run", clock: Callable[[], float] = time.monotonic, seq: int = 0):
        super().__init__(sock if sock is not None else open_socket(netns, run_root), netns or "node", timeout_s,
                         clock, seq)
        self.netns = netns

    def _dump(self, req: Callable[[int], bytes], decode: Callable[[bytes, Message], T], what: str) -> list[T]:
        for _attempt in range(DUMP_ATTEMPTS):
            out: list[T] = []
            interrupted = False
            for buf, m in self._replies(req, what):
                interrupted |= bool(m.flags & nlmsg.NLM_F_DUMP_INTR)
                if m.type == nlmsg.NLMSG_ERROR:
                    code = nlmsg.error_code(buf, m)
                    if code:
                        raise KernelError("dump", what, self.where, os.strerror(code), code)
                elif m.type not in (nlmsg.NLMSG_DONE, nlmsg.NLMSG_NOOP):
                    out.append(decode(buf, m))
            if not interrupted:
                return out
        raise KernelError("dump", what, self.where, f"interrupted {DUMP_ATTEMPTS} times in a row (devices kept "
                          "changing)", errno_mod.EINTR)

    def _get(self, req: Callable[[int], bytes], decode: Callable[[bytes, Message], T], what: str,
             absent: frozenset[int] = frozenset()) -> T | None:
        """One acked get: its row; None when the kernel answers with an errno in ``absent``; else raise."""
        row: T | None = None
        for buf, m in self._replies(req, what):
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                if code in absent:
                    return None
                if code:
                    raise KernelError("get", what, self.where, os.strerror(code), code)
                break  # the ack after the answer
            if m.type != nlmsg.NLMSG_NOOP and row is None:
                row = decode(buf, m)
        if row is None:
            raise KernelError("get", what, self.where, "acked without an answer", errno_mod.EBADMSG)
        return row

    # -- reads -----------------------------------------------------------------
    def devices(self) -> list[DevRow]:
        """Every RDMA device visible in this namespace (an empty list on a kernel with ib_core and no device)."""
        return self._dump(lambda s: request(CMD_GET, s, dump=True), decode_device, "RDMA devices")

    def device(self, index: int) -> DevRow | None:
        """One device by index; None when there is none (the kernel answers an unknown index with EINVAL)."""
        return self._get(lambda s: request(CMD_GET, s, dev_index=index), decode_device, f"RDMA device {index}",
                         NO_SUCH_DEVICE)

    def ports(self, dev_index: int, dev_name: str = "") -> list[PortRow]:
        what = f"ports of RDMA device {dev_name or dev_index}"
        return self._dump(lambda s: request(CMD_PORT_GET, s, dump=True, dev_index=dev_index), decode_port, what)

    def port(self, dev_index: int, port: int) -> PortRow | None:
        return self._get(lambda s: request(CMD_PORT_GET, s, dev_index=dev_index, port=port), decode_port,
                         f"RDMA device {dev_index} port {port}", NO_SUCH_DEVICE)

    def hw_counters(self, dev_index: int, port: int, ref: str = "") -> StatRow | None:
        """A port's hw counters; None when the driver keeps none (EOPNOTSUPP)."""
        return self._get(lambda s: request(CMD_STAT_GET, s, dev_index=dev_index, port=port), decode_stat,
                         f"hw counters of {ref or f'RDMA device {dev_index} port {port}'}",
                         frozenset({errno_mod.EOPNOTSUPP}))

    def system(self) -> SysRow:
        return self._get(lambda s: request(CMD_SYS_GET, s), decode_sys, "RDMA subsystem settings")  # type: ignore[return-value]
