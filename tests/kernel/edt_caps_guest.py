"""In the QEMU guest: the real daemon on the edt data plane with NET_ADMIN + BPF only (the DaemonSet's set).

``least_caps(outdir)`` (called by tests/kernel/edt_guest.py, before anything loads sch_fq) runs
``python -m shaperd run`` under ``setpriv --bounding-set=-all,+net_admin,+bpf --inh-caps=-all`` in the
bed's node namespace, on the 4-queue veth, with --bpffs-root on a private bpffs mount:

- the probe has no namespace (no CAP_SYS_ADMIN) and offers edt from evidence (kernel/qdisc_kinds.py:
  Debian's sch_fq is in modules.dep; whether it was loaded before is recorded);
- its first reconcile builds mq + one sch_fq per queue + the stamper (the kernel loads sch_fq itself);
- the rate controller steps: the stamper's rates, read through the pins, move from the planned initial
  ones while bronze sends, and bronze alone stays under its limit (loose bound: TCG is slow);
- SIGTERM; a second daemon adopts everything through the pins: its reconcile writes nothing and the
  stamper attached is the same program.

Records only; tests/kernel/test_edt.py judges. Each daemon runs in its own process group with a deadline
and is killed by group id if it does not stop; the bpffs is unmounted even on failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .edt_guest import BRONZE, MTU, NODE_IF, TX_QUEUES, Bed, classids, mbit, sh, tenants_yaml, traffic
from .guest_speed import deadline

LEAST = ["setpriv", "--bounding-set=-all,+net_admin,+bpf", "--inh-caps=-all"]
ROOT = Path(__file__).resolve().parents[2]
DAEMON_DEADLINE_S = 150.0  # quiet machine; scaled by guest_speed. Start-up under TCG (imports, probe, first reconcile) takes tens of seconds
BRONZE_S = 3.0


def loaded(module: str) -> bool:
    try:
        return any(line.split(" ", 1)[0] == module for line in Path("/proc/modules").read_text().splitlines())
    except OSError:
        return False


class Daemon:
    """``shaperd run`` with NET_ADMIN + BPF only, its JSON log in a file."""

    def __init__(self, bed: Bed, cfg: Path, bpffs: Path, log: Path):
        self.log = log
        argv = ["ip", "netns", "exec", bed.node, *LEAST, sys.executable, "-m", "shaperd", "--log-json", "run",
                "--config", str(cfg), "--bpffs-root", str(bpffs), "--metrics-address", "",
                "--resync-interval", "600"]
        with open(log, "w") as f:
            # ip netns exec and setpriv exec: this pid is the agent's.
            self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                      start_new_session=True)
        self.deadline = time.monotonic() + deadline(DAEMON_DEADLINE_S)

    def lines(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
        return out

    def wait_reconciled(self) -> dict:
        """The first "reconciled" log event (a condition with a deadline; the daemon's exit ends the wait)."""
        while time.monotonic() < self.deadline:
            got = [r for r in self.lines() if r.get("event") == "reconciled"]
            if got:
                return got[0]
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"no reconcile (rc {self.p.poll()}): {self.log.read_text()[-2000:]}")

    def stop(self) -> int | None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGTERM)
        try:
            return self.p.wait(timeout=max(1.0, min(30.0, self.deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            return None

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()


def summary(d: Daemon, rec: dict) -> dict:
    lines = d.lines()
    caps = next((r["capabilities"] for r in lines if "capabilities" in r), [])
    return {"capabilities": caps, "changes": rec.get("changes"),
            "kernel_changes": [r["change"] for r in lines if r.get("event") == "kernel change"],
            "failed": [r.get("error") for r in lines if r.get("event") == "kernel write failed"],
            "warnings": [r.get("warning") or r.get("reason") for r in lines if r.get("level") == "warning"]}


def stamper_prog_id(reader, ifindex: int, name: str) -> int:
    from shaperd.backends.edt.objects import PRIO_STAMPER

    return next((f.prog_id for f in reader.filters(ifindex, 0xFFFFFFF3, NODE_IF)
                 if f.kind == "bpf" and f.prio == PRIO_STAMPER and f.name == name), 0)


def least_caps(outdir: Path) -> dict:
    from shaperd.core import config
    from shaperd.backends.edt.plan import initial_q16, plan_device
    from shaperd.core.ids import assign_minors
    from shaperd.core.inventory import Link
    from shaperd.kernel import bpf_pins
    from shaperd.backends.edt import kernel_stamper as edt_prog
    from shaperd.kernel.rtnl import RtnlReader

    out: dict = {"sch_fq_loaded_before": loaded("sch_fq")}
    work = outdir / "edt-least-caps"
    bpffs = work / "bpffs"
    bpffs.mkdir(parents=True, exist_ok=True)
    sh(["mount", "-t", "bpf", "bpf", str(bpffs)])
    try:
        with Bed() as bed:
            cfg_path = work / "tenants.yaml"
            cfg_path.write_text(tenants_yaml("edt"))
            cfg = config.load_text(cfg_path.read_text())
            reader = RtnlReader(bed.node)
            ifindex = next(l.ifindex for l in reader.links() if l.name == NODE_IF)
            # The plan the daemon will make, by the pure planner: a probe as full root here would load sch_fq.
            link = Link(NODE_IF, ifindex, "veth", mtu=MTU, tx_queues=TX_QUEUES)
            dp, problems = plan_device(cfg, link, assign_minors([t.name for t in cfg.tenants]))
            assert dp is not None, problems
            keys = {s.tenant or "(none)": s.key for s in dp.shares}
            initial = dict(initial_q16(dp))
            out["keys"], out["rates_initial"] = keys, {n: initial[k] for n, k in keys.items()}
            pins = bpf_pins.PinStore(str(bpffs), bpf_pins.scope_for(None)).sub(edt_prog.STAMPER_PINS)
            with Daemon(bed, cfg_path, bpffs, work / "run1.log") as first:
                out["first"] = summary(first, first.wait_reconciled())
                out["sch_fq_loaded_after_apply"] = loaded("sch_fq")
                out["tc_qdisc"] = sh(["tc", "-n", bed.node, "qdisc", "show", "dev", NODE_IF]).stdout
                out["prog_id_first"] = stamper_prog_id(reader, ifindex, dp.stamper.name)
                with edt_prog.open_for_device(reader, ifindex, NODE_IF, dp.stamper.name, pins) as maps:
                    out["rates_before"] = _named(maps.read_rates(keys.values()), keys)
                    during: dict = {}

                    def sample(t0: float) -> None:
                        time.sleep(max(0.0, t0 + BRONZE_S - 0.5 - time.monotonic()))  # the traffic's schedule
                        during.update(_named(maps.read_rates(keys.values()), keys))

                    threads: list[threading.Thread] = []

                    def on_start(t0: float) -> None:
                        threads.append(threading.Thread(target=sample, args=(t0,)))
                        threads[0].start()

                    ids = classids(cfg)
                    res = traffic(bed, [(BRONZE["port"], ids["bronze"], 0.0, BRONZE_S)], BRONZE_S + 0.5,
                                  on_start=on_start)
                    for t in threads:
                        t.join()
                    out["rates_during"] = during
                    stats = maps.read_stats()
                    out["stamper_bytes"] = {n: stats[k].bytes if k in stats else 0 for n, k in keys.items()}
                bins = {int(k): v for k, v in res["bins"].get(str(BRONZE["port"]), {}).items()}
                out["bronze_alone_mbit"] = mbit(bins, 0.5, BRONZE_S)
                out["bronze_s"], out["bronze_bytes"] = BRONZE_S, sum(bins.values())
                out["first_rc"] = first.stop()
            with Daemon(bed, cfg_path, bpffs, work / "run2.log") as second:
                out["second"] = summary(second, second.wait_reconciled())
                out["prog_id_second"] = stamper_prog_id(reader, ifindex, dp.stamper.name)
                out["second_rc"] = second.stop()
            reader.close()
    finally:
        sh(["umount", str(bpffs)], check=False)
    return out


def _named(rates: dict[int, int], keys: dict[str, int]) -> dict[str, int]:
    return {n: rates.get(k, 0) for n, k in keys.items()}
