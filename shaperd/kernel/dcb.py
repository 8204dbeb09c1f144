"""The kernel's DCB netlink (IEEE 802.1Qaz): read and write ETS, max rates, the APP table; read PFC.

pyroute2 has no DCB support, so the messages are built here, on the framing
of kernel/nlmsg.py and the exchange of kernel/rtnl.py (one raw
NETLINK_ROUTE socket in the target namespace, a deadline on every answer).
Layouts are include/uapi/linux/dcbnl.h (Linux 6.1):

- request: nlmsghdr (RTM_GETDCB 78 / RTM_SETDCB 79, NLM_F_REQUEST|NLM_F_ACK,
  as iproute2's ``dcb`` sends it) + ``struct dcbmsg {u8 family, u8 cmd, u16 pad}``
  + DCB_ATTR_IFNAME (NUL-terminated) + the DCB_ATTR_IEEE nest;
- DCB_ATTR_IEEE_ETS: ``struct ieee_ets`` (3 + 7 x 8 = 59 bytes);
- DCB_ATTR_IEEE_MAXRATE: ``struct ieee_maxrate { u64 tc_maxrate[8] }`` in
  kbit/s (the uapi comment "specified in Kbps"; ``dcb maxrate`` divides its
  bytes/s by 125 before sending);
- DCB_ATTR_IEEE_APP_TABLE: a nest of DCB_ATTR_IEEE_APP, each
  ``struct dcb_app {u8 selector, u8 priority, u16 protocol}``; selector 5 is DSCP;
- DCB_ATTR_IEEE_PFC: ``struct ieee_pfc`` (136 bytes with its padding), read only.

A set is answered with an RTM_SETDCB carrying DCB_ATTR_IEEE as a u8: 0, or
the driver's (negative, truncated) errno. A driver without an op is skipped
silently and the answer is still 0, so callers read back (backends/dcb).
A device without DCB ops (veth) answers EOPNOTSUPP: ``DcbNotSupported``.
Trust (DCB_ATTR_DCB_APP_TRUST_TABLE) is not in the 6.1 uapi: not sent.
No policy here.
"""

from __future__ import annotations

import errno as errno_mod
import os
import struct
from dataclasses import dataclass

from shaperd.core.errors import KernelError
from shaperd.kernel import nlmsg
from shaperd.kernel.rtnl import RtnlReader

RTM_GETDCB, RTM_SETDCB = 78, 79
DCB_CMD_IEEE_SET, DCB_CMD_IEEE_GET, DCB_CMD_IEEE_DEL = 20, 21, 27
DCB_ATTR_IFNAME, DCB_ATTR_IEEE, DCB_ATTR_DCBX = 1, 13, 14
DCB_ATTR_IEEE_ETS, DCB_ATTR_IEEE_PFC, DCB_ATTR_IEEE_APP_TABLE = 1, 2, 3
DCB_ATTR_IEEE_MAXRATE = 7
DCB_ATTR_IEEE_APP = 1
NLA_F_NESTED = 0x8000
MAX_TCS = 8
TSA_STRICT, TSA_CB_SHAPER, TSA_ETS, TSA_VENDOR = 0, 1, 2, 255
SEL_DSCP = 5

DCBMSG = struct.Struct("=BBH")
ETS = struct.Struct("=BBB8s8s8s8s8s8s8s")
MAXRATE = struct.Struct("=8Q")
APP = struct.Struct("=BBH")
PFC = struct.Struct("=BBBxH2x8Q8Q")
# The answer meaning "this device has no DCB ops" (ENODEV is "no such device": a plain KernelError).
NOT_SUPPORTED_ERRNOS = frozenset({errno_mod.EOPNOTSUPP})


class DcbNotSupported(KernelError):
    """The device has no DCB ops (veth, most virtual devices) or the kernel no DCB netlink."""


@dataclass(frozen=True)
class Ets:
    """``struct ieee_ets``; per-TC arrays are 8-tuples."""

    tc_tx_bw: tuple[int, ...] = (0,) * MAX_TCS  # percent
    tc_tsa: tuple[int, ...] = (TSA_STRICT,) * MAX_TCS
    prio_tc: tuple[int, ...] = (0,) * MAX_TCS  # index: 802.1p priority
    willing: int = 0
    ets_cap: int = 0
    cbs: int = 0
    tc_rx_bw: tuple[int, ...] = (0,) * MAX_TCS
    tc_reco_bw: tuple[int, ...] = (0,) * MAX_TCS
    tc_reco_tsa: tuple[int, ...] = (0,) * MAX_TCS
    reco_prio_tc: tuple[int, ...] = (0,) * MAX_TCS

    def pack(self) -> bytes:
        arrays = (self.tc_tx_bw, self.tc_rx_bw, self.tc_tsa, self.prio_tc, self.tc_reco_bw, self.tc_reco_tsa,
                  self.reco_prio_tc)
        return ETS.pack(self.willing, self.ets_cap, self.cbs, *(bytes(a) for a in arrays))

    @classmethod
    def unpack(cls, data: bytes) -> "Ets":
        w, cap, cbs, tx, rx, tsa, ptc, rbw, rtsa, rptc = ETS.unpack_from(data)
        return cls(tc_tx_bw=tuple(tx), tc_tsa=tuple(tsa), prio_tc=tuple(ptc), willing=w, ets_cap=cap, cbs=cbs,
                   tc_rx_bw=tuple(rx), tc_reco_bw=tuple(rbw), tc_reco_tsa=tuple(rtsa), reco_prio_tc=tuple(rptc))


@dataclass(frozen=True, order=True)
class App:
    """One APP table entry (``struct dcb_app``): traffic matching (selector, protocol) gets ``priority``."""

    selector: int
    protocol: int
    priority: int

    def pack(self) -> bytes:
        return APP.pack(self.selector, self.priority, self.protocol)


@dataclass(frozen=True)
class Pfc:
    pfc_cap: int
    pfc_en: int  # bitmap of priorities with PFC on
    mbc: int = 0
    delay: int = 0

    @property
    def priorities(self) -> tuple[int, ...]:
        return tuple(p for p in range(MAX_TCS) if self.pfc_en >> p & 1)


@dataclass(frozen=True)
class DcbState:
    """What one IEEE_GET returned; None where the driver does not report it (no get op)."""

    ifname: str
    ets: Ets | None = None
    maxrate_kbps: tuple[int, ...] | None = None
    apps: tuple[App, ...] = ()
    pfc: Pfc | None = None
    dcbx: int | None = None


# -- encoding (pure) -------------------------------------------------------------
def _body(cmd: int, ifname: str, ieee: bytes | None) -> bytes:
    body = DCBMSG.pack(0, cmd, 0) + nlmsg.rta(DCB_ATTR_IFNAME, ifname.encode() + b"\0")
    if ieee is not None:
        body += nlmsg.rta(DCB_ATTR_IEEE | NLA_F_NESTED, ieee)
    return body


def _request(mtype: int, body: bytes, seq: int) -> bytes:
    return nlmsg.header(nlmsg.HDR.size + len(body), mtype, nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_ACK, seq) + body


def app_table(apps) -> bytes:
    return nlmsg.rta(DCB_ATTR_IEEE_APP_TABLE | NLA_F_NESTED, b"".join(nlmsg.rta(DCB_ATTR_IEEE_APP, a.pack())
                                                                    for a in apps))


def get_body(ifname: str) -> bytes:
    return _body(DCB_CMD_IEEE_GET, ifname, None)


def set_body(ifname: str, *, ets: Ets | None = None, maxrate_kbps=None, apps=()) -> bytes:
    """One IEEE_SET; the attributes in the kernel's handling order (ETS, MAXRATE, APP_TABLE)."""
    ieee = b""
    if ets is not None:
        ieee += nlmsg.rta(DCB_ATTR_IEEE_ETS, ets.pack())
    if maxrate_kbps is not None:
        ieee += nlmsg.rta(DCB_ATTR_IEEE_MAXRATE, MAXRATE.pack(*maxrate_kbps))
    if apps:
        ieee += app_table(apps)
    return _body(DCB_CMD_IEEE_SET, ifname, ieee)


def del_apps_body(ifname: str, apps) -> bytes:
    return _body(DCB_CMD_IEEE_DEL, ifname, app_table(apps))


def encode_get(ifname: str, seq: int) -> bytes:
    return _request(RTM_GETDCB, get_body(ifname), seq)


def encode_set(ifname: str, seq: int, **kw) -> bytes:
    return _request(RTM_SETDCB, set_body(ifname, **kw), seq)


def encode_del_apps(ifname: str, seq: int, apps) -> bytes:
    return _request(RTM_SETDCB, del_apps_body(ifname, apps), seq)


# -- decoding (pure) -------------------------------------------------------------
def decode_ieee(buf: bytes, msg: nlmsg.Message) -> DcbState:
    """An IEEE_GET answer: dcbmsg, DCB_ATTR_IFNAME, DCB_ATTR_IEEE {ETS, MAXRATE, PFC, APP_TABLE, ...}, DCBX."""
    top = nlmsg.attrs(buf, msg.start + DCBMSG.size, msg.end)
    ifname = nlmsg.string(buf, top.get(DCB_ATTR_IFNAME))
    ets = maxrate = pfc = None
    apps: list[App] = []
    span = top.get(DCB_ATTR_IEEE)
    if span is not None:
        ieee = nlmsg.attrs(buf, *span)
        s = ieee.get(DCB_ATTR_IEEE_ETS)
        if s is not None and s[1] - s[0] >= ETS.size:
            ets = Ets.unpack(bytes(buf[s[0]:s[0] + ETS.size]))
        s = ieee.get(DCB_ATTR_IEEE_MAXRATE)
        if s is not None and s[1] - s[0] >= MAXRATE.size:
            maxrate = MAXRATE.unpack_from(buf, s[0])
        s = ieee.get(DCB_ATTR_IEEE_PFC)
        if s is not None and s[1] - s[0] >= 5:
            cap, en, mbc = buf[s[0]], buf[s[0] + 1], buf[s[0] + 2]
            delay = struct.unpack_from("=H", buf, s[0] + 4)[0] if s[1] - s[0] >= 6 else 0
            pfc = Pfc(cap, en, mbc, delay)
        s = ieee.get(DCB_ATTR_IEEE_APP_TABLE)
        if s is not None:
            for typ, a in nlmsg.attr_list(buf, *s):
                if typ == DCB_ATTR_IEEE_APP and a[1] - a[0] >= APP.size:
                    sel, prio, proto = APP.unpack_from(buf, a[0])
                    apps.append(App(sel, proto, prio))
    dcbx = nlmsg.u8(buf, top.get(DCB_ATTR_DCBX))
    return DcbState(ifname, ets, maxrate, tuple(apps), pfc, dcbx)


def set_status(buf: bytes, msg: nlmsg.Message) -> int:
    """The u8 DCB_ATTR_IEEE of a set's answer: 0, or the driver's errno (sent as a negative int cut to u8)."""
    top = nlmsg.attrs(buf, msg.start + DCBMSG.size, msg.end)
    v = nlmsg.u8(buf, top.get(DCB_ATTR_IEEE), 0)
    return 256 - v if v > 127 else v


# -- the exchange ------------------------------------------------------------------
class DcbClient:
    """DCB reads and writes over one rtnetlink socket (``reader``: kernel/rtnl.py's, socket injectable)."""

    def __init__(self, reader: RtnlReader):
        self.reader = reader

    def _exchange(self, mtype: int, body: bytes, what: str, verb: str,
                  device: str) -> tuple[bytes, nlmsg.Message] | None:
        """Send one request (with NLM_F_ACK, as dcb does); its answer message, None for a bare ack."""
        for buf, msgs in self.reader._request(mtype, nlmsg.NLM_F_ACK, body, what, device):
            for m in msgs:
                if m.type == nlmsg.NLMSG_ERROR:
                    code = nlmsg.error_code(buf, m)
                    if not code:
                        return None
                    cls = DcbNotSupported if code in NOT_SUPPORTED_ERRNOS else KernelError
                    raise cls(verb, what, device, os.strerror(code), code)
                return buf, m
        return None

    def get(self, ifname: str) -> DcbState:
        got = self._exchange(RTM_GETDCB, get_body(ifname), "DCB IEEE configuration", "read", ifname)
        if got is None:
            raise KernelError("read", "DCB IEEE configuration", ifname, "acked without an answer")
        return decode_ieee(*got)

    def _set(self, body: bytes, what: str, verb: str, ifname: str) -> None:
        got = self._exchange(RTM_SETDCB, body, what, verb, ifname)
        if got is not None:
            code = set_status(*got)
            if code:
                raise KernelError(verb, what, ifname, f"the driver refused: {os.strerror(code)}", code)

    def set(self, ifname: str, *, ets: Ets | None = None, maxrate_kbps=None, apps=()) -> None:
        what = " and ".join(n for n, v in (("ETS", ets), ("max rates", maxrate_kbps), ("APP entries", apps)) if v)
        self._set(set_body(ifname, ets=ets, maxrate_kbps=maxrate_kbps, apps=apps), what or "nothing", "set", ifname)

    def delete_apps(self, ifname: str, apps) -> None:
        self._set(del_apps_body(ifname, apps), "APP entries", "delete", ifname)
