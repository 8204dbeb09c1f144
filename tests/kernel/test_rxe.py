"""Soft-RoCE (rxe) in a real kernel: sysfs discovery, the RDMA netlink reader and iproute2 agree.

One guest boot for all of these (the ``guest`` fixture): the guest made
``shrxe0`` on a veth and recorded what every source says; each test
compares two of them. No RDMA traffic: data over rxe was not shown to move
here, so every counter is compared as it stands, not as it moves.
"""

from __future__ import annotations

import json

import pytest

from shaperd.kernel import rdma_nl

from .. import strace_dump
from .guest_probe import RXE, VETH

pytestmark = pytest.mark.kernel


def only(rows: list, what: str):
    assert len(rows) == 1, f"expected one {what}, got {rows}"
    return rows[0]


def test_the_guest_ran_debians_kernel_made_the_device_and_left_nothing_behind(guest):
    r = guest.result
    assert r["uname"] == guest.run.kernel and guest.run.rc == 0
    for step in ("modprobe", "veth", "rxe", "cleanup_rxe"):
        assert guest.step(step)["rc"] == 0, guest.step(step)
    assert not r.get("errors"), r.get("errors")
    assert guest.run.group_gone, "a process of the guest's group (vng, qemu) outlived the run"


def test_before_any_device_the_kernel_answers_an_empty_dump(guest):
    before = guest.result["netlink_before"]
    assert before == {"devices": []} or before.get("absent") is True, before


def test_sysfs_discovery_and_rdma_netlink_agree(guest):
    r = guest.result
    dev = only(r["sysfs"]["devices"], "sysfs device")
    port = only(dev["ports"], "sysfs port")
    nd = only(r["netlink"]["devices"], "netlink device")
    np_ = only(r["netlink"]["ports"][RXE], "netlink port")
    assert nd["name"] == dev["name"] == RXE and nd["node_guid"] == dev["node_guid"]
    assert nd["ports"] == len(dev["ports"]) == 1 and np_["port"] == port["port"] == 1
    assert rdma_nl.LINK_LAYER_BY_PROTOCOL[nd["protocol"]] == port["link_layer"] == "Ethernet"
    assert rdma_nl.PORT_STATES[np_["state"]] == port["state"] == "ACTIVE"
    assert rdma_nl.PHYS_STATES[np_["phys_state"]] == port["phys_state"] == "LinkUp"
    assert [np_["netdev"]] == port["netdevs"] == [dev["parent"]] == [VETH]
    assert np_["netdev_index"] == r["veth_ifindex"]
    assert (np_["lid"], port["lid"]) == (None, None)  # RoCE: no LIDs either way
    assert (nd["fw_version"], dev["fw_ver"]) == (None, "")  # rxe reports no firmware
    assert dev["pci"] is None and r["sysfs"]["notes"] == []
    assert r["sysfs_netns_exclusive"] is False and r["netlink"]["system"]["netns_mode"] == 1


def test_rdma_netlink_agrees_with_the_rdma_tools_json(guest):
    r = guest.result
    tdev = only(json.loads(guest.step("rdma_dev")["stdout"]), "rdma dev")
    tlink = only(json.loads(guest.step("rdma_link")["stdout"]), "rdma link")
    nd = r["netlink"]["devices"][0]
    np_ = r["netlink"]["ports"][RXE][0]
    assert (nd["index"], nd["name"], nd["node_guid"], nd["sys_image_guid"]) == \
        (tdev["ifindex"], tdev["ifname"], tdev["node_guid"], tdev["sys_image_guid"])
    assert (np_["port"], np_["netdev"], np_["netdev_index"]) == (tlink["port"], tlink["netdev"], tlink["netdev_index"])
    assert (tlink["state"], tlink["physical_state"]) == ("ACTIVE", "LINK_UP")
    assert r["netlink"]["port_get"][f"{RXE}:1"] == np_  # a port get says what the port dump said
    assert r["netlink"]["device_get"][RXE] == nd and r["netlink"]["missing_device"] is None


def test_hw_counters_agree_across_sysfs_netlink_and_rdma_statistic(guest):
    r = guest.result
    files = set(r["hw_counter_files"]) - {"lifespan"}
    nl = r["netlink"]["stats"][f"{RXE}:1"]["counters"]
    tool = only(json.loads(guest.step("rdma_stat")["stdout"]), "rdma statistic")
    tool_counters = {k: v for k, v in tool.items() if k not in ("ifname", "port")}
    assert set(nl) == files == set(tool_counters) and "sent_pkts" in nl
    assert nl == tool_counters == r["counters"]["hw"]


def test_the_counter_reader_on_rxe_has_hw_counters_and_no_bytes(guest):
    c = guest.result["counters"]
    assert c["has_counters_dir"] is False
    assert (c["xmit_data_words"], c["xmit_packets"], c["xmit_wait"]) == (None, None, None)
    assert any("no counters/ directory" in n for n in c["notes"]) and len(c["hw"]) == 15


def test_our_requests_are_the_bytes_iproute2_sent_to_this_kernel(guest):
    def sent(step):
        return strace_dump.sent(guest.step(step)["stderr"])

    def seq(b):
        return int.from_bytes(b[8:12], "little")

    dump, get = sent("strace_dev")
    assert rdma_nl.request(rdma_nl.CMD_GET, seq(dump), dump=True) == dump
    assert rdma_nl.request(rdma_nl.CMD_GET, seq(get), dev_index=0) == get
    port = sent("strace_link")[1]
    assert rdma_nl.request(rdma_nl.CMD_PORT_GET, seq(port), dev_index=0, port=1) == port
    stat = sent("strace_stat")[1]
    assert rdma_nl.request(rdma_nl.CMD_STAT_GET, seq(stat), dev_index=0, port=1) == stat
    sysreq = sent("strace_sys")[-1]
    assert rdma_nl.request(rdma_nl.CMD_SYS_GET, seq(sysreq)) == sysreq


def test_rdma_status_in_the_guest_shows_the_owner_and_no_fake_bytes(guest):
    st = guest.step("status")
    assert st["rc"] == 0, st["stderr"][-2000:]
    out = json.loads(st["stdout"])
    port = only(only(out["devices"], "status device")["ports"], "status port")
    assert (port["device"], port["tenant"], port["service_level"]) == (RXE, "rdma-a", 2)
    assert port["traffic_class"] == (26 << 2) | 2  # derived from the only priority rank: AF31 with ECT(0)
    assert port["counters"]["bytes"] is None and port["counters"]["rate_bps"] is None
    assert port["hw_counters"]["sent_pkts"]["total"] == 0 and "sm_check" not in port
    assert out["netlink"] == {"available": True, "error": None, "devices": [RXE], "netns_exclusive": False}
    assert out["notes"] == []


def test_dcb_on_the_veth_is_a_typed_not_supported_that_costs_nothing_else(guest):
    got = guest.result["dcb_veth"]
    assert got["not_supported"] is True and got["errno"] == 95
    assert got["error"] == "read DCB IEEE configuration on shrxa: Operation not supported"
    assert got["links_after"] >= 3  # lo and the veth pair: the same socket still reads
