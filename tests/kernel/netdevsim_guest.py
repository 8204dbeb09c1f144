"""Runs inside the QEMU guest: shaperd's devlink and vfrate backends against netdevsim's real devlink core.

``python -m tests.kernel.netdevsim_guest OUTDIR`` (as root in the guest) loads
the netdevsim.ko scripts/setup built for this kernel (.cache/netdevsim/<release>/),
makes device 10 with 3 VFs, lays out a fixture sysfs view (Roots) in which
RDMA devices nsimvf0..2 are VFs 0..2 of PF eni10np1, whose device is
netdevsim10 on bus netdevsim (so its devlink handle is netdevsim/netdevsim10,
as pci/<pf> is on a NIC), and drives a Reconciler holding only the devlink
and vfrate backends through the scenarios of tests/kernel/test_netdevsim.py.
Every write either backend sends is counted (the devlink socket and the VF
rate kernel side are wrapped); iproute2's ``devlink -j port function rate
show`` and ``ip -j link show`` read what the kernel holds, independently.
Writes one OUTDIR/netdevsim.json; it asserts nothing. A step that raises is
recorded as data, so one broken step does not hide the others.

netdevsim (6.1) takes VF rates over IFLA_VF_RATE only in legacy mode
(switchdev: EOPNOTSUPP) and devlink rate objects only in switchdev mode,
so the vfrate scenarios run first, in legacy mode, then the devlink ones.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from tests import procs
from tests.rdma_fixture import Node

DEV_ID, NVFS = 10, 3
PF = f"eni{DEV_ID}np1"
DEVLINK = f"netdevsim/netdevsim{DEV_ID}"
STEP_TIMEOUT_S = 120.0  # one iproute2 command; TCG is slow, a busy host slower

# a: VF 0, b: VF 1; VF 2 belongs to no tenant (foreign rates are set on it by hand).
CFG_AB = """\
tenants:
  - {name: a, bandwidthGuarantee: 80Mbps, bandwidthLimit: 800Mbps, priority: 10, rdma: {devices: [nsimvf0]}}
  - {name: b, bandwidthGuarantee: 40Mbps, bandwidthLimit: 400Mbps, priority: 20, rdma: {devices: [nsimvf1]}}
"""
# a changed (rates), b removed.
CFG_A2 = """\
tenants:
  - {name: a, bandwidthGuarantee: 160Mbps, bandwidthLimit: 1600Mbps, priority: 10, rdma: {devices: [nsimvf0]}}
"""
# VF 1 moves from b to a new tenant c (a leaf re-parented from one shaperd node to another).
CFG_AC = """\
tenants:
  - {name: a, bandwidthGuarantee: 80Mbps, bandwidthLimit: 800Mbps, priority: 10, rdma: {devices: [nsimvf0]}}
  - {name: c, bandwidthGuarantee: 24Mbps, bandwidthLimit: 240Mbps, priority: 20, rdma: {devices: [nsimvf1]}}
"""
# A split that is not whole Mbit/s per device: 1 Gbit/s over 3 VFs of one tenant is one node, 1e9/8 B/s
# (whole), but 100.5 Mbit/s is not.
CFG_ODD = """\
tenants:
  - {name: a, bandwidthGuarantee: 10500Kbps, bandwidthLimit: 100500Kbps, priority: 10, rdma: {devices: [nsimvf0]}}
"""


def sh(*argv: str, check: bool = True) -> dict:
    p = procs.run(list(argv), timeout_s=STEP_TIMEOUT_S, check=False)
    out = {"argv": list(argv), "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
    return out


def write(path: str, text: str) -> None:
    Path(path).write_text(text)


def netdevsim_up(root: Path) -> dict:
    rel = platform.release()
    ko = root / ".cache" / "netdevsim" / rel / "netdevsim.ko"
    if not ko.exists():
        raise RuntimeError(f"{ko} missing: scripts/setup builds it (as root)")
    sh("modprobe", "psample")
    sh("insmod", str(ko))
    write("/sys/bus/netdevsim/new_device", f"{DEV_ID} 1")
    write(f"/sys/bus/netdevsim/devices/netdevsim{DEV_ID}/sriov_numvfs", str(NVFS))
    sh("ip", "link", "set", PF, "up")
    return {"release": rel, "ko": str(ko)}


def fixture(out: Path) -> Path:
    """A sysfs view with nsimvf0..2 as SR-IOV VFs of netdevsim10 (PF netdev eni10np1, driver netdevsim)."""
    node = Node(out / "fixture")
    pf = node.sys / "devices" / f"netdevsim{DEV_ID}"
    (pf / "net" / PF).mkdir(parents=True, exist_ok=True)
    write_f = node._write
    write_f(pf / "sriov_numvfs", str(NVFS))
    bus = node.sys / "bus" / "netdevsim"
    (bus / "drivers" / "netdevsim").mkdir(parents=True, exist_ok=True)
    node._link(pf / "subsystem", bus)
    node._link(pf / "driver", bus / "drivers" / "netdevsim")
    for i in range(NVFS):
        vf = node.pci_function(f"0000:00:01.{i}", bus="pci0000:00")
        node._link(vf / "physfn", pf)
        node._link(pf / f"virtfn{i}", vf)
        node.device(f"nsimvf{i}", vf, {1: {"link_layer": "Ethernet"}})
    return node.sys


class Counted:
    """Every write of both backends, in order: ("devlink", method, args) / ("vfrate", vf, min, max)."""

    def __init__(self):
        self.writes: list[list] = []

    def mark(self) -> int:
        return len(self.writes)

    def since(self, n: int) -> list[list]:
        return self.writes[n:]


def make_engine(sysroot: Path, run: Path, counted: Counted, before_delete=None):
    from shaperd.backends.devlink.backend import DevlinkBackend
    from shaperd.backends.vfrate import backend as vfb
    from shaperd.core.inventory import Capabilities
    from shaperd.core.roots import Roots
    from shaperd.engine.reconciler import Reconciler
    from shaperd.engine.registry import REGISTRY
    from shaperd.kernel import devlink as nl
    from shaperd.kernel import tc
    from shaperd.kernel.rtnl import RtnlReader

    class CountingNl(nl.DevlinkNl):
        def new_node(self, *a):
            counted.writes.append(["devlink", "new_node", *a])
            return super().new_node(*a)

        def set_node(self, *a):
            counted.writes.append(["devlink", "set_node", *a])
            return super().set_node(*a)

        def set_leaf_parent(self, *a):
            counted.writes.append(["devlink", "set_leaf_parent", *a])
            return super().set_leaf_parent(*a)

        def del_node(self, *a):
            counted.writes.append(["devlink", "del_node", *a])
            if before_delete is not None:
                before_delete(a)
            return super().del_node(*a)

    class CountingKernel(vfb._Kernel):
        def write(self, writer, ops):
            for op in ops:
                counted.writes.append(["vfrate", op.device, op.vf, op.min_mbps, op.max_mbps])
            return super().write(writer, ops)

    roots = Roots.of(sys=str(sysroot), run=str(run))
    writer = tc.open_writer(None, str(run), codec=REGISTRY.codec())
    dl = DevlinkBackend(lambda: CountingNl())
    vr = vfb.VfRateBackend(writer, kernel=CountingKernel(), state_file=run / "shaperd" / "vfrate-owned.json")
    return Reconciler(RtnlReader(None, run_root=str(run)), [dl, vr], Capabilities(), roots=roots)


def outcome(rep) -> dict:
    """A report as data: per target its applied ops, failures (type, errno, text), blocked, error."""
    targets = []
    for t in rep.devices:
        targets.append({"backend": t.backend, "device": t.device, "ops": [op.describe() for op in t.ops],
                        "failed": [{"op": op.describe(), "type": type(e).__name__, "errno": e.errno,
                                    "error": str(e)} for op, e in t.failed],
                        "blocked": t.blocked, "error": t.error})
    return {"ok": rep.ok() if callable(rep.ok) else rep.ok, "targets": targets}


def readers() -> dict:
    rate = sh("devlink", "-j", "port", "function", "rate", "show", check=False)
    link = sh("ip", "-j", "link", "show", "dev", PF, check=False)
    return {"rate": json.loads(rate["stdout"] or "{}") if rate["rc"] == 0 else rate,
            "link": json.loads(link["stdout"] or "[]") if link["rc"] == 0 else link}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    res: dict = {"uname": platform.release(), "steps": {}}
    print(f"netdevsim_guest: started, python {sys.version.split()[0]}", file=sys.stderr, flush=True)
    run = out / "run"
    counted = Counted()
    state: dict = {}

    def step(name, fn):
        t0 = time.monotonic()
        mark = counted.mark()
        try:
            val = fn()
            res["steps"][name] = {"ok": True, "value": val}
        except Exception as e:  # noqa: BLE001 - recorded as data for the host side
            res["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                  "trace": traceback.format_exc()[-3000:]}
        res["steps"][name]["writes"] = counted.since(mark)
        res["steps"][name]["seconds"] = round(time.monotonic() - t0, 2)
        res["seconds"] = round(time.monotonic() - started, 1)
        # Written after every step: a guest killed at its deadline still says how far it got.
        (out / "netdevsim.json.tmp").write_text(json.dumps(res, indent=1, default=str) + "\n")
        os.replace(out / "netdevsim.json.tmp", out / "netdevsim.json")
        print(f"netdevsim_guest: {name} {'ok' if res['steps'][name]['ok'] else 'FAILED'} "
              f"{res['steps'][name]['seconds']} s", file=sys.stderr, flush=True)

    def imports():
        import importlib

        for m in ("shaperd.core.config", "shaperd.engine.reconciler", "shaperd.backends.devlink.backend",
                  "shaperd.backends.vfrate.backend", "shaperd.kernel.tc", "shaperd.kernel.rtnl"):
            importlib.import_module(m)

    step("imports", imports)
    from shaperd.core import config

    cfg = {k: config.load_text(v) for k, v in
           {"ab": CFG_AB, "a2": CFG_A2, "ac": CFG_AC, "odd": CFG_ODD}.items()}
    step("setup", lambda: netdevsim_up(root))
    sysroot = fixture(out)
    step("inventory", lambda: [{"name": d.name, "vf": d.vf_index, "pf_netdev": d.pf_netdev,
                                "pf_devlink": d.pf_devlink}
                               for d in __import__("shaperd.discovery.rdma", fromlist=["discover"]).discover(
                                   __import__("shaperd.core.roots", fromlist=["Roots"]).Roots.of(sys=str(sysroot)))[0]])

    def engine(**kw):
        return make_engine(sysroot, run, counted, **kw)

    # ---- legacy mode: VF rates (IFLA_VF_RATE); devlink rate objects refused --------------------------
    def legacy_apply():
        state["rec"] = engine()
        return {"report": outcome(state["rec"].apply(cfg["ab"])), "read": readers()}

    step("legacy_apply", legacy_apply)
    step("legacy_resync", lambda: {"report": outcome(state["rec"].apply(cfg["ab"])), "read": readers()})
    step("legacy_foreign_vf", lambda: sh("ip", "link", "set", PF, "vf", "2", "min_tx_rate", "3", "max_tx_rate", "30"))

    def legacy_node_refusal():
        from shaperd.kernel import devlink as nl

        with nl.DevlinkNl() as conn:
            try:
                conn.new_node(DEVLINK, "shpd_probe", 1_250_000, None)
            except Exception as e:  # noqa: BLE001
                return {"type": type(e).__name__, "errno": getattr(e, "errno", None), "error": str(e)}
        return "accepted"

    step("legacy_node_refusal", legacy_node_refusal)
    step("legacy_restart", lambda: {"report": outcome(engine().apply(cfg["ab"])), "read": readers()})
    step("legacy_changed", lambda: {"report": outcome(state["rec"].apply(cfg["a2"])), "read": readers()})
    step("legacy_teardown", lambda: {"report": outcome(state["rec"].teardown()), "read": readers()})

    # ---- switchdev mode: devlink rate groups --------------------------------------------------------
    step("switchdev", lambda: sh("devlink", "dev", "eswitch", "set", DEVLINK, "mode", "switchdev"))
    step("ports", lambda: json.loads(sh("devlink", "-j", "port", "show")["stdout"]))
    step("foreign_node", lambda: sh("devlink", "port", "function", "rate", "add", f"{DEVLINK}/fgn_grp",
                                    "tx_share", "8mbit", "tx_max", "80mbit"))

    def sw_apply():
        state["rec"] = engine()
        return {"report": outcome(state["rec"].apply(cfg["ab"])), "read": readers()}

    step("sw_apply", sw_apply)
    step("sw_resync", lambda: {"report": outcome(state["rec"].apply(cfg["ab"])), "read": readers()})
    step("sw_restart", lambda: {"report": outcome(engine().apply(cfg["ab"])), "read": readers()})
    step("sw_move_leaf", lambda: {"report": outcome(state["rec"].apply(cfg["ac"])), "read": readers()})
    step("sw_changed_removed", lambda: {"report": outcome(state["rec"].apply(cfg["a2"])), "read": readers()})
    step("sw_odd_rates", lambda: {"report": outcome(state["rec"].apply(cfg["odd"])), "read": readers()})

    # tx_share above tx_max: does the core (or netdevsim) refuse it? Asked directly, on a node of the test's.
    def share_above_max():
        from shaperd.kernel import devlink as nl

        with nl.DevlinkNl() as conn:
            try:
                conn.new_node(DEVLINK, "tst_share", 50 * 125_000, 10 * 125_000)
                got = "accepted"
            except Exception as e:  # noqa: BLE001
                got = {"type": type(e).__name__, "errno": getattr(e, "errno", None), "error": str(e)}
        read = readers()
        sh("devlink", "port", "function", "rate", "del", f"{DEVLINK}/tst_share", check=False)
        return {"answer": got, "read": read}

    step("share_above_max", share_above_max)

    # EBUSY: b comes back, then is removed while a foreign node is parented under shpd_b between
    # shaperd's read and its delete (the hook runs just before the delete is sent).
    step("sw_ab_again", lambda: {"report": outcome(state["rec"].apply(cfg["ab"])), "read": readers()})

    def sneak_child(args):
        if args[1] == "shpd_b" and not state.get("sneaked"):
            state["sneaked"] = True
            sh("devlink", "port", "function", "rate", "add", f"{DEVLINK}/fgn_child")
            sh("devlink", "port", "function", "rate", "set", f"{DEVLINK}/fgn_child", "parent", "shpd_b")

    def ebusy():
        state["rec"] = engine(before_delete=sneak_child)
        return {"report": outcome(state["rec"].apply(cfg["a2"])), "read": readers()}

    step("sw_ebusy", ebusy)
    step("sw_ebusy_again", lambda: {"report": outcome(state["rec"].apply(cfg["a2"])), "read": readers()})
    step("sw_ebusy_free", lambda: sh("devlink", "port", "function", "rate", "set", f"{DEVLINK}/fgn_child",
                                     "noparent"))
    step("sw_ebusy_cleared", lambda: {"report": outcome(state["rec"].apply(cfg["a2"])), "read": readers()})
    step("sw_teardown", lambda: {"report": outcome(engine().teardown()), "read": readers()})
    step("sw_teardown_again", lambda: {"report": outcome(engine().teardown()), "read": readers()})
    step("sw_legacy_mode_back", lambda: sh("devlink", "dev", "eswitch", "set", DEVLINK, "mode", "legacy",
                                           check=False))

    # Non-switchdev through shaperd: the backend sees no rate objects and blocks (no write), twice.
    def legacy_devlink():
        sh("devlink", "port", "function", "rate", "del", f"{DEVLINK}/fgn_grp", check=False)
        sh("devlink", "port", "function", "rate", "del", f"{DEVLINK}/fgn_child", check=False)
        sh("devlink", "dev", "eswitch", "set", DEVLINK, "mode", "legacy")
        rec = engine()
        return {"first": outcome(rec.apply(cfg["ab"])), "second": outcome(rec.apply(cfg["ab"])), "read": readers()}

    step("legacy_devlink", legacy_devlink)
    step("dmesg", lambda: sh("dmesg", check=False)["stdout"][-4000:])
    res["done"] = True
    res["seconds"] = round(time.monotonic() - started, 1)
    (out / "netdevsim.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
