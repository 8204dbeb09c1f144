"""kernel/link.new_veth against this kernel: the pair it asks for is the pair ``ip -d link`` shows.

The capability probe (kernel/probe.py) builds its veths with it in a throwaway namespace; here a fresh
named namespace holds them so iproute2 can read them back independently: names, peer, the TX queue count
asked for on both ends, and the first end up.
"""

from __future__ import annotations

import errno
import json
import os

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from shaperd.kernel import link, tc
from shaperd_bed import netns

from .conftest import needs_root

pytestmark = needs_root


@pytest.fixture
def ns():
    with netns.Namespaces(stop_grace_s=0) as nets:
        name = nets.add(f"veth-{os.getpid()}")
        w = tc.open_writer(name)
        try:
            yield name, w
        finally:
            w.close()


def shown(ns: str, dev: str) -> dict:
    (row,) = json.loads(netns.run(["ip", "-n", ns, "-d", "-j", "link", "show", "dev", dev]).stdout)
    return row


@pytest.mark.parametrize("queues", [0, 4])
def test_the_pair_and_its_queues_are_what_ip_shows(ns, queues):
    name, w = ns
    w.nlm_request_batch([link.new_veth("v0", "v1", num_tx_queues=queues)])
    v0, v1 = shown(name, "v0"), shown(name, "v1")
    assert v0["linkinfo"]["info_kind"] == v1["linkinfo"]["info_kind"] == "veth"
    assert v0["link"] == "v1" and v1["link"] == "v0"  # each other's peer
    assert "UP" in v0["flags"] and "UP" not in v1["flags"]
    if not queues:  # the kernel's default, whatever it is here: what iproute2 gets without numtxqueues
        netns.run(["ip", "-n", name, "link", "add", "r0", "type", "veth", "peer", "name", "r1"])
        queues = shown(name, "r0")["num_tx_queues"]
    assert v0["num_tx_queues"] == v1["num_tx_queues"] == queues


def test_an_existing_name_is_refused_not_replaced(ns):
    name, w = ns
    w.nlm_request_batch([link.new_veth("v0", "v1")])
    before = shown(name, "v0")["ifindex"]
    with pytest.raises(NetlinkError) as e:
        w.nlm_request_batch([link.new_veth("v0", "v2")])
    assert e.value.code == errno.EEXIST
    assert shown(name, "v0")["ifindex"] == before
