"""A device's ethtool features over generic netlink (ETHTOOL_MSG_FEATURES_GET), read-only.

What the HTB offload device probe (discovery/htb_offload.py) needs to know:
whether ``hw-tc-offload`` (NETIF_F_HW_TC, which sch_htb's htb_init checks
through tc_can_offload() before it asks the driver) is among the device's
ACTIVE features, and whether the driver lets it be changed (HW). pyroute2
0.9.7's NlEthtool has no features command, so the request is hand-built
here, as ethtool(8) builds it: the family resolved by name ("ethtool",
CTRL_CMD_GETFAMILY), then FEATURES_GET with a nested header naming the
device by ifindex. Bitsets are asked for in verbose form (no
ETHTOOL_FLAG_COMPACT_BITSETS), so every set bit comes with its name and no
bit index (which differs between kernel versions) is hard-coded.

Constants are the kernel's include/uapi/linux/ethtool_netlink.h. Every
exchange has one deadline (kernel/nlexchange.py). Never writes: FEATURES_SET
is not built here at all.
"""

from __future__ import annotations

import errno as errno_mod
from typing import NamedTuple

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.devlink import GENL, GenlExchange, ack_message, genl_message

FAMILY = "ethtool"
ETHTOOL_GENL_VERSION = 1
ETHTOOL_MSG_FEATURES_GET = 11  # user -> kernel
ETHTOOL_MSG_FEATURES_GET_REPLY = 11  # kernel -> user
ETHTOOL_A_HEADER_DEV_INDEX, ETHTOOL_A_HEADER_DEV_NAME, ETHTOOL_A_HEADER_FLAGS = 1, 2, 3
ETHTOOL_A_FEATURES_HEADER, ETHTOOL_A_FEATURES_HW, ETHTOOL_A_FEATURES_WANTED = 1, 2, 3
ETHTOOL_A_FEATURES_ACTIVE, ETHTOOL_A_FEATURES_NOCHANGE = 4, 5
ETHTOOL_A_BITSET_NOMASK, ETHTOOL_A_BITSET_SIZE, ETHTOOL_A_BITSET_BITS = 1, 2, 3
ETHTOOL_A_BITSET_VALUE, ETHTOOL_A_BITSET_MASK = 4, 5
ETHTOOL_A_BITSET_BITS_BIT = 1
ETHTOOL_A_BITSET_BIT_INDEX, ETHTOOL_A_BITSET_BIT_NAME, ETHTOOL_A_BITSET_BIT_VALUE = 1, 2, 3
NLA_F_NESTED = 0x8000
HW_TC_OFFLOAD = "hw-tc-offload"  # netdev_features_strings[NETIF_F_HW_TC_BIT]
DEFAULT_TIMEOUT_S = 2.0


class Features(NamedTuple):
    """A device's feature names: ``active`` (in force now), ``hw`` (the driver lets them be changed)."""

    active: frozenset[str]
    hw: frozenset[str]


class EthtoolAbsent(KernelError):
    """This kernel has no ethtool generic netlink family (before 5.6)."""


def features_request(family: int, seq: int, ifindex: int) -> bytes:
    header = nlmsg.rta(ETHTOOL_A_HEADER_DEV_INDEX, nlmsg.U32.pack(ifindex))
    body = nlmsg.rta(ETHTOOL_A_FEATURES_HEADER | NLA_F_NESTED, header)
    return genl_message(family, ETHTOOL_MSG_FEATURES_GET, seq, body, version=ETHTOOL_GENL_VERSION)


def _bitset_names(buf: bytes, span: tuple[int, int] | None) -> frozenset[str]:
    """The names of the set bits of a verbose bitset (a list: NOMASK, or a value/mask pair's set ones)."""
    if span is None:
        return frozenset()
    a = nlmsg.attrs(buf, span[0], span[1])
    nomask = ETHTOOL_A_BITSET_NOMASK in a
    bits = a.get(ETHTOOL_A_BITSET_BITS)
    if bits is None:
        return frozenset()
    out = set()
    for typ, bspan in nlmsg.attr_list(buf, bits[0], bits[1]):
        if typ != ETHTOOL_A_BITSET_BITS_BIT:
            continue
        b = nlmsg.attrs(buf, bspan[0], bspan[1])
        if nomask or ETHTOOL_A_BITSET_BIT_VALUE in b:
            name = nlmsg.string(buf, b.get(ETHTOOL_A_BITSET_BIT_NAME))
            if name:
                out.add(name)
    return frozenset(out)


def decode_features(buf: bytes, msg: nlmsg.Message) -> Features:
    a = nlmsg.attrs(buf, msg.start + GENL.size, msg.end)
    return Features(_bitset_names(buf, a.get(ETHTOOL_A_FEATURES_ACTIVE)), _bitset_names(buf, a.get(ETHTOOL_A_FEATURES_HW)))


class EthtoolNl(GenlExchange):
    """Feature reads over one generic netlink socket (``sock`` and ``clock`` injectable for tests)."""

    FAMILY = FAMILY
    DEFAULT_TIMEOUT_S = DEFAULT_TIMEOUT_S

    def absent(self, what: str, code: int) -> KernelError:
        return EthtoolAbsent("resolve", what, self.where, "the kernel has no ethtool netlink family", code)

    def failed(self, what: str, code: int, text: str) -> KernelError:
        return KernelError("resolve", what, self.where, _cause(code, text), code)

    def features(self, ifindex: int, device: str) -> Features:
        """The device's active and changeable features (KernelError with the kernel's reason if it refuses)."""
        fam = self.family()
        what = "ethtool features"
        out = None
        for buf, m in self._replies(lambda s: features_request(fam, s, ifindex), f"{what} of {device}"):
            if m.type == nlmsg.NLMSG_ERROR:
                code = nlmsg.error_code(buf, m)
                if code:
                    raise KernelError("read", what, device, _cause(code, ack_message(buf, m)), code)
                break
            if m.type == fam and out is None:
                out = decode_features(buf, m)
        if out is None:
            raise KernelError("read", what, device, "acked without an answer", errno_mod.EBADMSG)
        return out


def _cause(code: int, text: str) -> str:
    import os

    return os.strerror(code) + (f" ({text})" if text else "")
