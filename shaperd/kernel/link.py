"""Network devices as rtnetlink requests: create one of a kind (up), set one up, delete one.

Generic, no policy: which device to create, of which kind and under which name is a backend's decision
(the tenant-ingress IFBs: backends/ingress/). Encoding only, as pyroute2 messages the node's writer
sends like any tc request (kernel/tc.py: bounded, acked, deadlined batches); each request is the one
iproute2 sends, byte for byte (tests/unit/test_ingress_codec.py against ``strace`` of ``ip link add
name X up type KIND``, ``ip link set dev X up`` and ``ip link del dev X``).
"""

from __future__ import annotations

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, nla, nlmsg
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_NEWLINK

IFF_UP = 0x1
IFNAMSIZ = 16  # with the terminating NUL: a name has at most 15 characters


class ifinfmsg(nlmsg):
    """struct ifinfomsg and the two attributes written here. pyroute2's own class writes IFLA_INFO_KIND with
    a NUL; iproute2 (and so the contract test) without one: the kernel reads either (nla_strscpy)."""

    fields = (("family", "B"), ("__align", "x"), ("ifi_type", "H"), ("index", "i"), ("flags", "I"),
              ("change", "I"))
    nla_map = ((3, "IFLA_IFNAME", "asciiz"), (18, "IFLA_LINKINFO", "linkinfo"))

    class linkinfo(nla):
        nla_map = ((1, "IFLA_INFO_KIND", "string"),)


def _link(msg_type: int, flags: int, ifindex: int, up_change: bool, attrs: list) -> ifinfmsg:
    m = ifinfmsg()
    m["family"], m["index"] = 0, ifindex
    m["flags"], m["change"] = (IFF_UP, IFF_UP) if up_change else (0, 0)
    m["header"]["type"], m["header"]["flags"] = msg_type, flags
    m["attrs"] = attrs
    return m


def new_link(name: str, kind: str) -> ifinfmsg:
    """Create device ``name`` of ``kind``, administratively up (``ip link add name NAME up type KIND``).

    NLM_F_EXCL: an existing device of that name is refused (EEXIST), never changed."""
    if not name or len(name) >= IFNAMSIZ:
        raise ValueError(f"interface name {name!r}: 1 to {IFNAMSIZ - 1} characters")
    return _link(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 0, True,
                 [["IFLA_IFNAME", name], ["IFLA_LINKINFO", {"attrs": [["IFLA_INFO_KIND", kind]]}]])


def set_up(ifindex: int) -> ifinfmsg:
    """Set device ``ifindex`` administratively up (``ip link set dev X up``)."""
    return _link(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex, True, [])


def delete_link(ifindex: int) -> ifinfmsg:
    """Delete device ``ifindex`` and everything on it (``ip link del dev X``)."""
    return _link(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex, False, [])
