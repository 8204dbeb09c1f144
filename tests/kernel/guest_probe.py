"""Runs inside the QEMU guest (Debian's kernel, host filesystem shared): make an rxe device, read it every way.

``python -m tests.kernel.guest_probe OUTDIR`` (as root in the guest) loads
rdma_rxe, creates a veth and ``rdma link add shrxe0 type rxe netdev
shrxa``, then records into OUTDIR/result.json what each source says about
it: shaperd's sysfs discovery, shaperd's RDMA netlink reader, shaperd's
counter reader, ``shaperd rdma status --json``, iproute2's ``rdma -j``
output, and ``strace`` dumps of the bytes iproute2's ``rdma`` sends and
the kernel answers. It asserts nothing: the host-side tests
(tests/kernel/test_rxe.py) compare. Every step's failure is recorded as
data, so one broken step does not hide the others.

It also records the kernel's answer before any RDMA device exists (an
empty dump or a typed error), which is part of the reader's contract.
It is the first of the boot's guest programs (tests/kernel/vm.py
GUEST_PROGRAMS, run by tests/kernel/guest_main.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

VETH, PEER, RXE = "shrxa", "shrxb", "shrxe0"
STEP_TIMEOUT_S = 120  # on a quiet machine (TCG ~15x slower than the host); scaled by the guest's measured speed
STRACE = ["strace", "-f", "-e", "trace=socket,sendto,sendmsg,recvmsg", "-e", "write=all", "-e", "read=all", "-xx"]
TENANTS = f"""\
tenants:
  - name: rdma-a
    bandwidthGuarantee: 1Gbps
    priority: 10
    rdma: {{devices: ["{RXE}:1"], serviceLevel: 2}}
"""


def run(argv: list[str], timeout_s: float | None = None) -> dict:
    """One step as an argument list, in its own process group, killed by group id at its deadline
    (default: STEP_TIMEOUT_S scaled by the guest's measured speed, tests/kernel/guest_speed.py)."""
    from .guest_speed import deadline

    timeout_s = deadline(STEP_TIMEOUT_S) if timeout_s is None else timeout_s
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as e:
        return {"argv": argv, "rc": None, "stdout": "", "stderr": f"{type(e).__name__}: {e}"}
    try:
        out, err = p.communicate(timeout=timeout_s)
        return {"argv": argv, "rc": p.returncode, "stdout": out, "stderr": err}
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return {"argv": argv, "rc": None, "stdout": out, "stderr": err + f"\nkilled after {timeout_s} s"}


def plain(obj):
    """Dataclasses (frozen, with tuples and mappings inside) as JSON-ready data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj


def attempt(out: dict, key: str, fn) -> None:
    try:
        out[key] = plain(fn())
    except Exception as e:  # noqa: BLE001 - recorded for the host to judge
        out.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def netlink_answer():
    """What the RDMA netlink reader says about this kernel right now: rows, or the typed error."""
    from shaperd.kernel import rdma_nl

    try:
        with rdma_nl.RdmaNlReader() as r:
            return {"devices": plain(r.devices())}
    except rdma_nl.RdmaNetlinkAbsent as e:
        return {"absent": True, "errno": e.errno, "error": str(e)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}


def netlink_full():
    from shaperd.kernel import rdma_nl

    with rdma_nl.RdmaNlReader() as r:
        devs = r.devices()
        out = {"devices": plain(devs), "ports": {}, "port_get": {}, "stats": {}, "system": plain(r.system())}
        for d in devs:
            ports = r.ports(d.index, d.name)
            out["ports"][d.name] = plain(ports)
            for p in ports:
                out["port_get"][p.ref] = plain(r.port(d.index, p.port))
                out["stats"][p.ref] = plain(r.hw_counters(d.index, p.port, p.ref))
        out["device_get"] = {d.name: plain(r.device(d.index)) for d in devs}
        out["missing_device"] = plain(r.device(4242))
        return out


def dcb_answer():
    """The kernel's DCB answer on the veth (no DCB ops): the typed "not supported" error, or what came instead."""
    from shaperd.kernel import dcb
    from shaperd.kernel.rtnl import RtnlReader

    with RtnlReader() as r:
        try:
            return {"state": plain(dcb.DcbClient(r).get(VETH))}
        except dcb.DcbNotSupported as e:
            return {"not_supported": True, "errno": e.errno, "error": str(e), "links_after": len(r.links())}


def main(outdir: str) -> int:
    out_dir = Path(outdir)
    out: dict = {"uname": os.uname().release, "steps": {}}
    steps = out["steps"]
    out["netlink_before"] = netlink_answer()
    steps["strace_empty_dump"] = run(STRACE + ["rdma", "-j", "dev", "show"])
    steps["modprobe"] = run(["modprobe", "rdma_rxe"])
    steps["veth"] = run(["ip", "link", "add", VETH, "type", "veth", "peer", "name", PEER])
    steps["up_a"] = run(["ip", "link", "set", VETH, "up"])
    steps["up_b"] = run(["ip", "link", "set", PEER, "up"])
    steps["rxe"] = run(["rdma", "link", "add", RXE, "type", "rxe", "netdev", VETH])
    attempt(out, "dcb_veth", dcb_answer)
    out["veth_ifindex"] = int(Path(f"/sys/class/net/{VETH}/ifindex").read_text()) if Path(
        f"/sys/class/net/{VETH}").exists() else None
    for key, argv in {"dev": ["rdma", "-j", "dev", "show"], "link": ["rdma", "-j", "link", "show"],
                      "stat": ["rdma", "-j", "statistic", "show", "link", f"{RXE}/1"],
                      "sys": ["rdma", "system", "show"]}.items():
        steps[f"rdma_{key}"] = run(argv)
        steps[f"strace_{key}"] = run(STRACE + argv)

    from shaperd.discovery import rdma as rdma_discovery
    from shaperd.discovery import rdma_counters
    from shaperd.core.roots import DEFAULT

    attempt(out, "sysfs", lambda: dict(zip(("devices", "notes"), rdma_discovery.discover(DEFAULT))))
    attempt(out, "sysfs_netns_exclusive", lambda: rdma_discovery.netns_exclusive(DEFAULT))
    attempt(out, "netlink", netlink_full)
    attempt(out, "counters", lambda: rdma_counters.read_port(DEFAULT, RXE, 1))
    attempt(out, "hw_counter_files", lambda: sorted(
        p.name for p in Path(f"/sys/class/infiniband/{RXE}/ports/1/hw_counters").iterdir()))

    cfg = out_dir / "tenants.yaml"
    cfg.write_text(TENANTS)
    shaperd = [sys.executable, "-m", "shaperd"]
    steps["status"] = run(shaperd + ["rdma", "status", "--json", "--config", str(cfg), "--interval", "0.2"])

    steps["cleanup_rxe"] = run(["rdma", "link", "delete", RXE])
    steps["cleanup_veth"] = run(["ip", "link", "del", VETH])
    (out_dir / "result.json").write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
