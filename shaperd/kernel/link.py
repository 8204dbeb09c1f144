"""Network devices as rtnetlink requests: create one of a kind (up), a veth pair, set one up, delete one.

Generic, no policy: which device to create, of which kind and under which name is a backend's decision
(the tenant-ingress IFBs: backends/ingress/). Encoding only, as pyroute2 messages the node's writer
sends like any tc request (kernel/tc.py: bounded, acked, deadlined batches); each request is the one
iproute2 sends, byte for byte (tests/unit/test_ingress_codec.py against ``strace`` of ``ip link add
name X up type KIND``, ``ip link set dev X up`` and ``ip link del dev X``). ``new_veth`` is the capability
probe's pair (kernel/probe.py, in its throwaway namespace); tests/integration/test_link_veth.py reads one back.
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
    nla_map = ((3, "IFLA_IFNAME", "asciiz"), (18, "IFLA_LINKINFO", "linkinfo"), (31, "IFLA_NUM_TX_QUEUES", "uint32"))

    class linkinfo(nla):
        nla_map = ((1, "IFLA_INFO_KIND", "string"), (2, "IFLA_INFO_DATA", "veth_data"))

        class veth_data(nla):
            """IFLA_INFO_DATA of kind veth (the only kind written with data here): the peer."""

            nla_map = ((1, "VETH_INFO_PEER", "peer"),)

            class peer(nla):
                """VETH_INFO_PEER: a struct ifinfomsg, then the peer's own attributes."""

                fields = (("family", "B"), ("__align", "x"), ("ifi_type", "H"), ("index", "i"), ("flags", "I"),
                          ("change", "I"))
                nla_map = ((3, "IFLA_IFNAME", "asciiz"), (31, "IFLA_NUM_TX_QUEUES", "uint32"))


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


def new_veth(name: str, peer: str, num_tx_queues: int = 0) -> ifinfmsg:
    """Create veth ``name`` (up) and its peer ``peer`` (down), each with ``num_tx_queues`` TX queues when not 0
    (``ip link add name NAME numtxqueues N up type veth peer name PEER numtxqueues N``). NLM_F_EXCL as new_link."""
    for n in (name, peer):
        if not n or len(n) >= IFNAMSIZ:
            raise ValueError(f"interface name {n!r}: 1 to {IFNAMSIZ - 1} characters")
    queues = [["IFLA_NUM_TX_QUEUES", num_tx_queues]] if num_tx_queues else []
    peer_msg = {"family": 0, "ifi_type": 0, "index": 0, "flags": 0, "change": 0,
                "attrs": [*queues, ["IFLA_IFNAME", peer]]}
    info = {"attrs": [["IFLA_INFO_KIND", "veth"], ["IFLA_INFO_DATA", {"attrs": [["VETH_INFO_PEER", peer_msg]]}]]}
    return _link(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 0, True,
                 [*queues, ["IFLA_IFNAME", name], ["IFLA_LINKINFO", info]])  # iproute2's order


def set_up(ifindex: int) -> ifinfmsg:
    """Set device ``ifindex`` administratively up (``ip link set dev X up``)."""
    return _link(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex, True, [])


def delete_link(ifindex: int) -> ifinfmsg:
    """Delete device ``ifindex`` and everything on it (``ip link del dev X``)."""
    return _link(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex, False, [])
