"""End to end: our hand-built cls_bpf program steers forwarded pod traffic into
the tenant's HTB class on the uplink, while node-originated traffic falls
through to the default class.

Topology (all addresses in 198.18.0.0/15, all inside namespaces we create):

    POD eth0 198.18.1.2 --veth-- NODE cali0 198.18.1.1
                                 NODE up0   198.18.2.1 --veth-- PEER eth0 198.18.2.2

NODE forwards; up0 has HTB root 7368: with 7368:10 (tenant) and 7368:2
(default).  IPv6 is disabled and the up0 <-> PEER neighbours are static, so
nothing but our datagrams crosses up0 and counters can be checked exactly.
"""

import hashlib
import json
import os
import shutil
import sys
import time

import pytest
from shaperd_bed import netns

from shaperd.kernel import bpf

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (netns, tc, bpf)"),
    pytest.mark.skipif(
        not (shutil.which("ip") and shutil.which("tc")), reason="needs iproute2 ip and tc"
    ),
]

HTB_HANDLE = 0x73680000
TENANT_CLASS = 0x73680010
DEFAULT_CLASS = 0x73680002
PEER_IP = "198.18.2.2"
ETH_IP_UDP_OVERHEAD = 14 + 20 + 8  # what HTB counts on a veth beyond the payload

# Runs inside a namespace: send COUNT datagrams of SIZE payload bytes.
SENDER = """
import socket, sys
dst, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count):
    s.sendto(b"x" * size, (dst, 9))
"""


def run(*argv):
    return netns.run(argv).stdout


def ns_run(ns, *argv):
    return netns.run(argv, ns).stdout


def mac(ns, ifname):
    return netns.link(ns, ifname)["address"]


@pytest.fixture
def topo():
    ok, reason = bpf.bpf_supported()
    if not ok:
        pytest.skip(f"cannot load BPF programs: {reason}")
    tag = f"shpdbpf{os.getpid()}"
    with netns.Namespaces(stop_grace_s=0) as nets:
        # No IPv6 autoconf/MLD chatter on the links we count on.
        pod, node, peer = (nets.add(f"{tag}-{role}", ipv6=False) for role in ("pod", "node", "peer"))
        ns_run(node, "sysctl", "-qw", "net.ipv4.ip_forward=1")

        run("ip", "-n", node, "link", "add", "cali0", "type", "veth",
            "peer", "name", "eth0", "netns", pod)
        run("ip", "-n", node, "link", "add", "up0", "type", "veth",
            "peer", "name", "eth0", "netns", peer)
        for ns, ifname, addr in (
            (pod, "eth0", "198.18.1.2/24"),
            (node, "cali0", "198.18.1.1/24"),
            (node, "up0", "198.18.2.1/24"),
            (peer, "eth0", "198.18.2.2/24"),
        ):
            run("ip", "-n", ns, "addr", "add", addr, "dev", ifname)
            run("ip", "-n", ns, "link", "set", ifname, "up")
        run("ip", "-n", pod, "route", "add", "default", "via", "198.18.1.1")
        run("ip", "-n", peer, "route", "add", "198.18.1.0/24", "via", "198.18.2.1")
        # Static neighbours: no ARP on up0, so its counters only see our packets.
        run("ip", "-n", node, "neigh", "replace", PEER_IP, "lladdr", mac(peer, "eth0"),
            "dev", "up0", "nud", "permanent")
        run("ip", "-n", peer, "neigh", "replace", "198.18.2.1", "lladdr", mac(node, "up0"),
            "dev", "eth0", "nud", "permanent")

        run("tc", "-n", node, "qdisc", "add", "dev", "up0", "root", "handle", "7368:",
            "htb", "default", "2")
        for classid in ("7368:10", "7368:2"):
            run("tc", "-n", node, "class", "add", "dev", "up0", "parent", "7368:",
                "classid", classid, "htb", "rate", "1gbit")
        yield {"pod": pod, "node": node, "peer": peer}


def class_counters(ipr, ifindex):
    out = {}
    for msg in ipr.get_classes(index=ifindex):
        basic = msg.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")
        out[msg["handle"]] = (basic["bytes"], basic["packets"])
    return out


def wait_counters(ipr, ifindex, expected, timeout=30.0):
    # HTB updates class byte/packet stats at dequeue, which may lag enqueue.
    deadline = time.monotonic() + timeout
    while True:
        got = class_counters(ipr, ifindex)
        if all(got[c] == v for c, v in expected.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_pod_traffic_lands_in_tenant_class(topo):
    from pyroute2 import IPRoute
    from pyroute2.protocols import ETH_P_ALL

    node = topo["node"]
    with IPRoute(netns=node) as ipr:
        host_if = ipr.link_lookup(ifname="cali0")[0]
        uplink = ipr.link_lookup(ifname="up0")[0]
        # Decoy entries around the real one exercise the chain; if one of them
        # wrongly matched, node traffic would show up in the tenant class.
        mapping = {100000: TENANT_CLASS, host_if: TENANT_CLASS, 2**31 - 1: TENANT_CLASS}
        insns = bpf.ifindex_classifier(mapping)
        name = bpf.program_name(mapping)
        fd = bpf.load_sched_cls(insns, name)
        try:
            # Classic mode (no direct_action): the return value is the classid.
            ipr.tc("add-filter", "bpf", uplink, parent=HTB_HANDLE, prio=10,
                   protocol=ETH_P_ALL, fd=fd, name=name)
        finally:
            os.close(fd)  # the filter holds its own reference to the program

        # The dump echoes the name we attached with (TCA_BPF_NAME), classic mode.
        opts = [
            f.get_attr("TCA_OPTIONS")
            for f in ipr.get_filters(index=uplink, parent=HTB_HANDLE)
            if f.get_attr("TCA_OPTIONS") is not None
        ]
        assert [o.get_attr("TCA_BPF_NAME") for o in opts] == [name]
        assert not (opts[0].get_attr("TCA_BPF_FLAGS") or 0) & 1  # not direct-action

        # pyroute2 0.9.7 doesn't decode TCA_BPF_ID/TAG; tc shows them, plus the
        # program's own name (from bpf_attr.prog_name, via BPF_OBJ_GET_INFO).
        shown = json.loads(run("tc", "-n", node, "-j", "filter", "show", "dev", "up0"))
        opt = next(f["options"] for f in shown if "options" in f)
        assert opt["bpf_name"] == name and opt["prog"]["name"] == name
        # The kernel tag is a hash prefix of the instructions (SHA-256 on 6.18,
        # SHA-1 on older kernels), so it is computable in userspace too.
        assert opt["prog"]["tag"] in (
            hashlib.sha256(insns).hexdigest()[:16], hashlib.sha1(insns).hexdigest()[:16]
        )

        before = class_counters(ipr, uplink)
        assert set(before) >= {TENANT_CLASS, DEFAULT_CLASS}

        # Forwarded traffic from the pod -> tenant class.
        n_pod, size_pod = 25, 700
        ns_run(topo["pod"], sys.executable, "-c", SENDER, PEER_IP, str(size_pod), str(n_pod))
        tb, tp = before[TENANT_CLASS]
        want_tenant = (tb + n_pod * (size_pod + ETH_IP_UDP_OVERHEAD), tp + n_pod)
        mid = wait_counters(ipr, uplink, {TENANT_CLASS: want_tenant})
        assert mid[TENANT_CLASS] == want_tenant
        assert mid[DEFAULT_CLASS] == before[DEFAULT_CLASS]

        # Locally originated traffic (ingress_ifindex 0) -> no match -> default.
        n_node, size_node = 11, 333
        ns_run(node, sys.executable, "-c", SENDER, PEER_IP, str(size_node), str(n_node))
        db, dp = before[DEFAULT_CLASS]
        want_default = (db + n_node * (size_node + ETH_IP_UDP_OVERHEAD), dp + n_node)
        after = wait_counters(ipr, uplink, {DEFAULT_CLASS: want_default})
        assert after[DEFAULT_CLASS] == want_default
        assert after[TENANT_CLASS] == want_tenant


def test_load_failure_reports_verifier_log():
    ok, reason = bpf.bpf_supported()
    if not ok:
        pytest.skip(f"cannot load BPF programs: {reason}")
    with pytest.raises(bpf.BpfError) as exc:
        bpf.load_sched_cls(bpf.exit_(), "shpd_bad")  # r0 never written
    msg = str(exc.value)
    assert msg.startswith("load BPF program shpd_bad: Permission denied: ")
    assert "R0 !read_ok" in msg


def test_largest_classifier_is_accepted_by_verifier():
    ok, reason = bpf.bpf_supported()
    if not ok:
        pytest.skip(f"cannot load BPF programs: {reason}")
    # MAX_ENTRIES is derived from the 1M-insn limit; prove the kernel agrees
    # (this also exceeds the verifier's 8192 pending-branch limit that a JEQ
    # chain would hit).
    mapping = {i: 0x73680010 for i in range(1, bpf.MAX_ENTRIES + 1)}
    os.close(bpf.load_sched_cls(bpf.ifindex_classifier(mapping), "shpd_max"))
