"""The devlink and vfrate backends against a real kernel's devlink core: netdevsim in the QEMU guest.

The tier's one boot (tests/kernel/vm.py GUEST_PROGRAMS) runs
tests/kernel/netdevsim_guest.py, which drives a
Reconciler with the two backends on a fixture sysfs view whose VFs are
netdevsim's, counts every write, and records what iproute2's ``devlink``
and ``ip`` read back. The tests here compare. Needs root and the
netdevsim.ko scripts/setup builds; as root, a missing module is a failure.
"""

from __future__ import annotations

import errno

import pytest

from . import vm

pytestmark = pytest.mark.kernel

DEVLINK = "netdevsim/netdevsim10"
MBIT = 125_000  # B/s


@pytest.fixture(scope="session")
def nsim(guest) -> dict:
    """The netdevsim program's result from the tier's one boot (tests/kernel/conftest.py ``guest``)."""
    _, image = vm.check_tools()
    rel = image.name.removeprefix("vmlinuz-")
    ko = vm.ROOT / ".cache" / "netdevsim" / rel / "netdevsim.ko"
    if not ko.exists():
        pytest.fail(f"{ko} missing: run scripts/setup as root (it builds netdevsim for {rel})", pytrace=False)
    res = guest.result.get("netdevsim")
    prog = guest.result.get("programs", {}).get("netdevsim", {})
    if res is None:
        pytest.fail(f"the netdevsim guest program wrote no result (its run: rc {prog.get('rc')}, "
                    f"{prog.get('seconds')} s). Its stderr:\n{str(prog.get('stderr', ''))[-4000:]}", pytrace=False)
    print("netdevsim guest steps (s): " + ", ".join(f"{k} {v['seconds']}" for k, v in res["steps"].items()))
    if not res.get("done"):
        pytest.fail(f"the netdevsim guest program stopped after step {list(res['steps'])[-1]} (rc {prog.get('rc')}, "
                    f"{prog.get('seconds')} s). Its stderr:\n{str(prog.get('stderr', ''))[-4000:]}", pytrace=False)
    res["boot_seconds"] = guest.run.seconds
    res["group_gone"] = guest.run.group_gone
    return res


def step(res: dict, name: str) -> dict:
    s = res["steps"][name]
    assert s["ok"], f"guest step {name} failed: {s.get('error')}\n{s.get('trace', '')}"
    return s


def writes(s: dict, backend: str) -> list:
    return [w for w in s["writes"] if w[0] == backend]


def nodes(s: dict) -> dict:
    """devlink's own reader: node name -> (tx_share B/s, tx_max B/s) and leaf port -> parent."""
    rate = s["value"]["read"]["rate"]["rate"]
    out = {}
    for handle, r in rate.items():
        name = handle.split("/")[-1]
        out[name] = {"type": r["type"], "tx_share": r.get("tx_share", 0), "tx_max": r.get("tx_max", 0),
                     "parent": r.get("parent")}
    return out


def vf_rates(s: dict) -> dict:
    link = s["value"]["read"]["link"][0]
    return {v["vf"]: (v["rate"]["min_tx"], v["rate"]["max_tx"]) for v in link.get("vfinfo_list", [])}


def targets(s: dict, backend: str, key: str = "report") -> list:
    return [t for t in s["value"][key]["targets"] if t["backend"] == backend]


def test_guest_ran_and_left_nothing_behind(nsim):
    step(nsim, "setup")
    assert nsim["group_gone"], "vng/qemu outlived the run"
    inv = step(nsim, "inventory")["value"]
    assert {d["name"]: (d["vf"], d["pf_netdev"], d["pf_devlink"]) for d in inv} == {
        f"nsimvf{i}": (i, "eni10np1", DEVLINK) for i in range(3)}


# -- VF rates (legacy mode) --------------------------------------------------------------------------

def test_vf_rates_apply_read_back_and_an_in_sync_resync_writes_nothing(nsim):
    s = step(nsim, "legacy_apply")
    assert sorted(w[2:] for w in writes(s, "vfrate")) == [[0, 80, 800], [1, 40, 400]]
    assert all(not t["failed"] for t in targets(s, "vfrate"))
    r = vf_rates(s)
    assert r[0] == (80, 800) and r[1] == (40, 400) and r[2] == (0, 0)  # ip -j link show, independently
    s = step(nsim, "legacy_resync")
    assert s["writes"] == [] and vf_rates(s)[0] == (80, 800)


def test_vf_rates_restart_adopts_and_leaves_a_foreign_vf(nsim):
    step(nsim, "legacy_foreign_vf")
    s = step(nsim, "legacy_restart")
    assert writes(s, "vfrate") == [] and vf_rates(s)[2] == (3, 30)


def test_vf_rates_changed_removed_then_teardown(nsim):
    s = step(nsim, "legacy_changed")
    assert sorted(w[2:] for w in writes(s, "vfrate")) == [[0, 160, 1600], [1, 0, 0]]
    assert vf_rates(s) == {0: (160, 1600), 1: (0, 0), 2: (3, 30)}
    s = step(nsim, "legacy_teardown")
    assert [w[2:] for w in writes(s, "vfrate")] == [[0, 0, 0]]
    assert vf_rates(s) == {0: (0, 0), 1: (0, 0), 2: (3, 30)}  # the foreign VF keeps its rates


def test_non_switchdev_refuses_a_node_typed_with_the_kernels_words(nsim):
    got = step(nsim, "legacy_node_refusal")["value"]
    assert got["type"] == "RateUnsupported" and got["errno"] == errno.EOPNOTSUPP
    assert "Node creation allowed only in switchdev mode" in got["error"] and DEVLINK in got["error"]


def test_non_switchdev_through_shaperd_is_blocked_and_nothing_is_sent_twice(nsim):
    s = step(nsim, "legacy_devlink")
    assert writes(s, "devlink") == []
    for key in ("first", "second"):
        (t,) = targets(s, "devlink", key)
        assert "no devlink rate objects" in t["blocked"]


# -- devlink rate groups (switchdev mode) ------------------------------------------------------------

def test_vf_ports_are_pcivf_with_pfnum_and_vfnum(nsim):
    ports = step(nsim, "ports")["value"]["port"]
    vf = {p["vfnum"]: h for h, p in ports.items() if p.get("flavour") == "pcivf"}
    assert sorted(vf) == [0, 1, 2] and all(ports[h]["pfnum"] == 0 for h in vf.values())


def test_rate_groups_apply_read_back_and_an_in_sync_resync_writes_nothing(nsim):
    s = step(nsim, "sw_apply")
    dl = writes(s, "devlink")
    kinds = [w[1] for w in dl]
    # nodes first, then the leaves parented to them
    assert kinds == ["new_node", "new_node", "set_leaf_parent", "set_leaf_parent"], dl
    assert all(not t["failed"] for t in targets(s, "devlink"))
    n = nodes(s)
    assert (n["shpd_a"]["tx_share"], n["shpd_a"]["tx_max"]) == (80 * MBIT, 800 * MBIT)
    assert (n["shpd_b"]["tx_share"], n["shpd_b"]["tx_max"]) == (40 * MBIT, 400 * MBIT)
    leaf = {h: r for h, r in n.items() if r["type"] == "leaf"}
    assert sorted(r.get("parent") for r in leaf.values() if r.get("parent")) == ["shpd_a", "shpd_b"]
    assert (n["fgn_grp"]["tx_share"], n["fgn_grp"]["tx_max"]) == (8 * MBIT, 80 * MBIT)
    s = step(nsim, "sw_resync")
    assert writes(s, "devlink") == []


def test_restart_adopts_shaperds_nodes_and_leaves_the_foreign_one(nsim):
    s = step(nsim, "sw_restart")
    assert writes(s, "devlink") == []
    assert "fgn_grp" in nodes(s)


def test_vf_rates_on_a_switchdev_pf_are_refused_once_not_in_a_loop(nsim):
    # netdevsim (like mlx5) takes VF rates only through devlink in switchdev mode: IFLA_VF_RATE is EOPNOTSUPP
    s = step(nsim, "sw_apply")
    # VF 0 with its minimum, then limit only (both EOPNOTSUPP); VF 1 is not sent: the PF is recorded as refusing
    assert [w[2:] for w in writes(s, "vfrate")] == [[0, 80, 800], [0, 0, 800]]
    fails = [f for t in targets(s, "vfrate") for f in t["failed"]]
    assert fails[0]["errno"] == errno.EOPNOTSUPP and len(fails) == 2 and "not sent" in fails[1]["error"]
    assert writes(step(nsim, "sw_resync"), "vfrate") == []  # recorded as refused: not re-sent


def test_a_leaf_moves_from_one_shaperd_node_to_another(nsim):
    s = step(nsim, "sw_move_leaf")
    assert all(not t["failed"] for t in targets(s, "devlink")), targets(s, "devlink")
    n = nodes(s)
    assert "shpd_b" not in n and "shpd_c" in n
    assert sorted(r["parent"] for r in n.values() if r["type"] == "leaf" and r["parent"]) == ["shpd_a", "shpd_c"]


def test_changed_and_removed_tenant(nsim):
    s = step(nsim, "sw_changed_removed")
    assert all(not t["failed"] for t in targets(s, "devlink")), targets(s, "devlink")
    n = nodes(s)
    assert (n["shpd_a"]["tx_share"], n["shpd_a"]["tx_max"]) == (160 * MBIT, 1600 * MBIT)
    assert "shpd_c" not in n and "fgn_grp" in n
    assert [r["parent"] for r in n.values() if r["type"] == "leaf" and r["parent"]] == ["shpd_a"]


def test_rates_are_whole_mbit_so_the_driver_takes_them(nsim):
    s = step(nsim, "sw_odd_rates")
    assert all(not t["failed"] for t in targets(s, "devlink")), targets(s, "devlink")
    n = nodes(s)
    assert n["shpd_a"]["tx_share"] % MBIT == 0 and n["shpd_a"]["tx_max"] % MBIT == 0
    assert (n["shpd_a"]["tx_share"], n["shpd_a"]["tx_max"]) == (10 * MBIT, 100 * MBIT)


def test_tx_share_above_tx_max_what_the_core_says(nsim):
    v = step(nsim, "share_above_max")["value"]
    # Linux 6.1's devlink core and netdevsim do not compare the two: the node is kept as sent.
    assert v["answer"] == "accepted"
    r = v["read"]["rate"]["rate"][f"{DEVLINK}/tst_share"]
    assert (r["tx_share"], r["tx_max"]) == (50 * MBIT, 10 * MBIT)


def test_ebusy_on_a_node_with_children_is_typed_and_not_resent(nsim):
    step(nsim, "sw_ab_again")
    s = step(nsim, "sw_ebusy")
    dels = [w for w in writes(s, "devlink") if w[1] == "del_node"]
    assert [w[3] for w in dels] == ["shpd_b"]
    (f,) = [f for t in targets(s, "devlink") for f in t["failed"]]
    assert f["errno"] == errno.EBUSY and "Node has children" in f["error"] and "shpd_b" in f["error"]
    s = step(nsim, "sw_ebusy_again")
    assert writes(s, "devlink") == []  # the child is seen now: the delete is not sent again
    (t,) = targets(s, "devlink")
    assert "fgn_child" in t["blocked"]
    step(nsim, "sw_ebusy_free")
    s = step(nsim, "sw_ebusy_cleared")
    assert [w[1] for w in writes(s, "devlink")] == ["del_node"] and "shpd_b" not in nodes(s)


def test_teardown_leaves_nothing_of_shaperds_and_the_foreign_nodes(nsim):
    s = step(nsim, "sw_teardown")
    n = nodes(s)
    assert not any(k.startswith("shpd_") for k in n)
    assert not any(r["parent"] and r["parent"].startswith("shpd_") for r in n.values())
    assert {"fgn_grp", "fgn_child"} <= set(n)
    assert writes(step(nsim, "sw_teardown_again"), "devlink") == []
