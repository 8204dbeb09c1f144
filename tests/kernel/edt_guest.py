"""Runs inside the QEMU guest (Debian 6.1, sch_fq and mq present): the edt data plane for real.

``python -m tests.kernel.edt_guest OUTDIR [--bench --repeats N]`` as root in the guest writes
OUTDIR/edt.json with:

- ``cases``: the stamper's crafted BPF_PROG_TEST_RUN cases (tests/edt_cases.py);
- ``apply``: shaperd's reconcile of an edt uplink (veth with 4 TX queues) in a
  namespace it creates: the first apply's writes, a resync's (none), ``tc``'s view;
- ``least_caps``: the real daemon with NET_ADMIN + BPF only (tests/kernel/edt_caps_guest.py);
- ``isolation``: two tenants on that uplink, UDP receivers on the peer counting
  bytes in 100 ms bins: bronze alone (its limit must hold), then gold wakes up
  (its guarantee, the utilisation, the time to converge); the senders mark
  their packets with SO_PRIORITY = the tenant's class id, which is what the
  map classifier (issue 11) writes into skb->priority;
- ``pod_caps``: a capped pod and an uncapped tenant-mate of gold, then bronze
  wakes (tests/kernel/edt_pods_guest.py);
- with ``--bench``: the same for htb on the same bed and kernel, repeated, and
  CPU per packet (busy time from /proc/stat / packets received) with 1, 2 and
  4 senders for both data planes; with ``--bench --pod-caps`` only the
  pod-caps scenario, repeated.

It asserts nothing (the host's tests/kernel/test_edt.py and bench/edt_qemu.py judge).
Every helper process runs in its own process group with a deadline and is
killed by group id; the namespaces are removed even on failure. Addresses:
198.18.7.0/24 only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from .guest_speed import deadline

NODE_IF, PEER_IF = "edt0", "edt1"
NODE_IP, PEER_IP = "198.18.7.1", "198.18.7.2"
TX_QUEUES = 4
MTU = 33000
DATAGRAM = 32000  # one skb per datagram at this MTU: few packets per byte, which a Python sender under TCG can carry
CAPACITY_MBIT = 40
GOLD = {"name": "gold", "g": 0.6, "limit": None, "prio": 100, "port": 5001}
BRONZE = {"name": "bronze", "g": 0.2, "limit": 0.5, "prio": 50, "port": 5002}
BIN_S = 0.1
PROC_DEADLINE_S = 120.0

SENDER = r"""
import errno, socket, sys, time
dst, port, prio, size, start, stop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if len(sys.argv) > 7:  # a pod's source address: the map classifier, not SO_PRIORITY, says whose packet it is
    s.bind((sys.argv[7], 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, prio)
# A deep send buffer (SO_SNDBUFFORCE, root): a Python sender under TCG is descheduled for tens of ms at a time,
# and must keep a backlog queued meanwhile, as a real bulk sender does (the default 208 KiB is 6 datagrams).
s.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)  # SO_SNDBUFFORCE
s.settimeout(0.2)
payload = b"x" * size
print("ready", flush=True)
t0 = float(sys.stdin.readline())  # the driver's common time origin, sent once everyone is ready
t_start, t_stop = t0 + start, t0 + stop
time.sleep(max(0.0, t_start - time.monotonic()))  # the traffic schedule, not a synchronisation
n = 0
while time.monotonic() < t_stop:
    try:
        s.sendto(payload, (dst, port))
        n += 1
    except (socket.timeout, BlockingIOError):
        pass
    except OSError as e:
        if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.EPERM):
            raise
# And when its last sendto returned, from t0: UDP's sendto runs the egress qdisc (and the stamper) before it
# returns, so no packet of this sender was stamped later. A sender descheduled in its last sendto stamps
# past t_stop; the bounds in tests/kernel/test_edt.py use this, not t_stop.
print(n, time.monotonic() - t0)
"""

RECEIVER = r"""
import json, selectors, socket, sys, time
ports, duration, bin_s = [int(p) for p in sys.argv[1].split(",")], float(sys.argv[2]), float(sys.argv[3])
sel = selectors.DefaultSelector()
for p in ports:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", p))
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, p)
print("ready", flush=True)
t0 = float(sys.stdin.readline())
t_end = t0 + duration
bins = {p: {} for p in ports}
count = {p: 0 for p in ports}
while (now := time.monotonic()) < t_end:
    for key, _ in sel.select(timeout=0.05):
        while True:
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                break
            b = int((time.monotonic() - t0) / bin_s)
            bins[key.data][b] = bins[key.data].get(b, 0) + len(data)
            count[key.data] += 1
print(json.dumps({"bins": bins, "packets": count}))
"""


def sh(argv: list[str], timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    """``argv`` in its own process group; ``timeout`` is a quiet machine's, scaled by the guest's measured speed."""
    timeout = deadline(timeout)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise RuntimeError(f"{argv}: killed after {timeout} s")
    if check and p.returncode:
        raise RuntimeError(f"{argv}: rc {p.returncode}: {err.strip()}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


class Bed:
    """Two namespaces joined by a veth with TX_QUEUES queues; removed on exit."""

    def __init__(self):
        tag = os.getpid()
        self.node, self.peer = f"shedt-n{tag}", f"shedt-p{tag}"

    def __enter__(self) -> Bed:
        for ns in (self.node, self.peer):
            sh(["ip", "netns", "add", ns])
        sh(["ip", "-n", self.node, "link", "add", NODE_IF, "numtxqueues", str(TX_QUEUES), "numrxqueues",
            str(TX_QUEUES), "type", "veth", "peer", "name", PEER_IF, "numtxqueues", str(TX_QUEUES), "numrxqueues",
            str(TX_QUEUES), "netns", self.peer])
        for ns, dev, ip in ((self.node, NODE_IF, NODE_IP), (self.peer, PEER_IF, PEER_IP)):
            sh(["ip", "-n", ns, "link", "set", dev, "mtu", str(MTU), "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        return self

    def __exit__(self, *exc) -> None:
        for ns in (self.node, self.peer):
            sh(["ip", "netns", "del", ns], check=False)


def tenants_yaml(dataplane: str, capacity_mbit: int = CAPACITY_MBIT) -> str:
    lines = [f"node: {{interfaces: [{NODE_IF}], capacity: {capacity_mbit}Mbps, dataplane: {dataplane}}}", "tenants:"]
    for t in (GOLD, BRONZE):
        lines.append(f"  - name: {t['name']}")
        lines.append(f"    bandwidthGuarantee: {int(t['g'] * capacity_mbit * 1000)}Kbps")
        if t["limit"]:
            lines.append(f"    bandwidthLimit: {int(t['limit'] * capacity_mbit * 1000)}Kbps")
        lines.append(f"    priority: {t['prio']}")
    return "\n".join(lines) + "\n"


def reconciler(bed: Bed):
    from shaperd.engine.reconciler import open_node
    from shaperd.engine.probe import probe_capabilities

    return open_node(probe_capabilities(), netns=bed.node)


def classids(cfg) -> dict[str, int]:
    from shaperd.backends.common.objects import classid
    from shaperd.core.ids import assign_minors

    return {n: classid(m) for n, m in assign_minors([t.name for t in cfg.tenants]).items()}


def apply_step(bed: Bed, dataplane: str) -> dict:
    from shaperd.core import config

    cfg = config.load_text(tenants_yaml(dataplane))
    rec = reconciler(bed)
    first = rec.apply(cfg)
    second = rec.apply(cfg)
    return {
        "capabilities": list(rec.capabilities.notes), "fq": rec.capabilities.fq, "mq": rec.capabilities.mq,
        "first": [o.describe() for t in first.devices for o in t.ops],
        "first_failed": [str(e) for t in first.devices for _, e in t.failed],
        "errors": [t.error for t in first.devices if t.error] + [t.blocked for t in first.devices if t.blocked],
        "problems": [str(p) for p in first.problems], "warnings": list(first.plan.warnings),
        "resync_changes": second.changes,
        "tc_qdisc": sh(["tc", "-n", bed.node, "qdisc", "show", "dev", NODE_IF]).stdout,
        "tc_filter": sh(["tc", "-n", bed.node, "filter", "show", "dev", NODE_IF, "egress"]).stdout,
    }, cfg, rec


def switch_step(bed: Bed) -> dict:
    """htb -> edt -> htb on one uplink, then teardown: each move lands without a failed write, resyncs are empty."""
    from shaperd.core import config

    rec = reconciler(bed)
    out: dict = {}

    def tc_state():
        return (sh(["tc", "-n", bed.node, "qdisc", "show", "dev", NODE_IF]).stdout
                + sh(["tc", "-n", bed.node, "filter", "show", "dev", NODE_IF, "egress"]).stdout)

    for name, dp in (("htb", "htb"), ("to_edt", "edt"), ("back_to_htb", "htb")):
        cfg = config.load_text(tenants_yaml(dp))
        rep = rec.apply(cfg)
        out[name] = {"writes": [o.describe() for t in rep.devices for o in t.ops],
                     "failed": [str(e) for t in rep.devices for _, e in t.failed],
                     "errors": [t.error or t.blocked for t in rep.devices if t.error or t.blocked],
                     "resync_changes": rec.apply(cfg).changes, "tc": tc_state()}
    rep = rec.teardown()
    out["teardown"] = {"writes": [o.describe() for t in rep.devices for o in t.ops],
                       "failed": [str(e) for t in rep.devices for _, e in t.failed], "tc": tc_state()}
    return out


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_ready(procs: list[subprocess.Popen], deadline_s: float = PROC_DEADLINE_S) -> None:
    """Every helper has printed "ready" (sockets made and bound) before the clock starts."""
    import select

    deadline_s = deadline(deadline_s)
    end = time.monotonic() + deadline_s
    for p in procs:
        left = end - time.monotonic()
        if left <= 0 or not select.select([p.stdout], [], [], left)[0] or p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"helper {p.args[-6:]} not ready within {deadline_s} s")


def finish(p: subprocess.Popen, deadline_s: float) -> str:
    deadline_s = deadline(deadline_s)
    try:
        out, err = p.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise RuntimeError(f"helper killed at its deadline: {err[-500:]}")
    if p.returncode:
        raise RuntimeError(f"helper rc {p.returncode}: {err[-500:]}")
    return out


def traffic(bed: Bed, flows: list[tuple], duration: float, size: int = DATAGRAM,
            on_start=None) -> dict:
    """flows: (port, priority, start, stop[, source address]) offsets from t0. Returns the receiver's bins and
    sender counts."""
    ports = sorted({f[0] for f in flows})
    rx = start(["ip", "netns", "exec", bed.peer, sys.executable, "-c", RECEIVER, ",".join(map(str, ports)),
                str(duration), str(BIN_S)])
    senders: list[subprocess.Popen] = []
    try:
        senders = [start(["ip", "netns", "exec", bed.node, sys.executable, "-c", SENDER, PEER_IP, str(f[0]),
                          str(f[1]), str(size), str(f[2]), str(f[3]), *f[4:]]) for f in flows]
        wait_ready([rx, *senders])  # the receiver listens before anyone sends
        t0 = time.monotonic() + 0.2
        for p in (rx, *senders):
            p.stdin.write(f"{t0}\n")
            p.stdin.close()
            p.stdin = None  # communicate() must not flush it again
        if on_start is not None:
            on_start(t0)
        last = [(finish(s, PROC_DEADLINE_S).strip().splitlines() or ["0 0"])[-1].split() for s in senders]
        sent = [int(x[0]) for x in last]
        until = [float(x[1]) if len(x) > 1 else 0.0 for x in last]
        out = json.loads(finish(rx, PROC_DEADLINE_S).splitlines()[-1])
    finally:
        for p in [rx, *senders]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    out["sent"] = sent
    out["sent_until_s"] = until  # per sender: its last sendto's return, seconds from t0
    return out


def mbit(bins: dict, a: float, b: float) -> float:
    """Mean Mbit/s over [a, b) seconds from t0 (a measurement for bench/edt_qemu.py, not a pass/fail input)."""
    lo, hi = round(a / BIN_S), round(b / BIN_S)
    total = sum(v for k, v in bins.items() if lo <= int(k) < hi)
    return total * 8 / ((hi - lo) * BIN_S) / 1e6


def bytes_before(bins: dict, t_s: float) -> int:
    """Payload bytes the receiver got before ``t_s`` seconds from t0 (by its own clock, which reads a packet
    no earlier than it left: so these bytes were all stamped to leave before ``t_s``)."""
    return sum(v for k, v in bins.items() if int(k) < round(t_s / BIN_S))


def isolation(bed: Bed, cfg, rec, dataplane: str, alone_s: float = 3.0, both_s: float = 4.0) -> dict:
    """bronze alone, then gold wakes up; receivers on the peer count what got through."""
    from shaperd.backends.edt.loop import EdtLoop

    ids = classids(cfg)
    loop = None
    if dataplane == "edt":
        from shaperd.backends.edt.loop import maps_opener as _edt_maps_opener

        loop = EdtLoop(_edt_maps_opener(bed.node))
        plan = rec.plan(cfg)
        loop.set_targets(plan.desired["edt"].devices)
        loop.start()
    try:
        end = alone_s + both_s
        res = traffic(bed, [(BRONZE["port"], ids["bronze"], 0.0, end), (GOLD["port"], ids["gold"], alone_s, end)],
                      end + 0.5)
    finally:
        if loop is not None:
            loop.stop()
    g = {p: {int(k): v for k, v in b.items()} for p, b in res["bins"].items()}
    gold, bronze = g.get(str(GOLD["port"]), {}), g.get(str(BRONZE["port"]), {})
    cap = CAPACITY_MBIT
    # Convergence: from gold's start to the end of the first 300 ms window after which every trailing 300 ms
    # window holds >= 98 % of gold's guarantee (one 100 ms bin is a few 32 KB datagrams: too coarse alone).
    want = GOLD["g"] * cap * 0.98
    series = [gold.get(i, 0) * 8 / BIN_S / 1e6 for i in range(round(alone_s / BIN_S), round(end / BIN_S))]
    avg = [sum(series[i - 2:i + 1]) / 3 for i in range(2, len(series))]
    conv = None
    for i in range(len(avg)):
        if all(v >= want for v in avg[i:]):
            conv = (i + 3) * BIN_S
            break
    settle = 1.0
    out = {
        "dataplane": dataplane,
        "bronze_alone_mbit": mbit(bronze, 0.5, alone_s),
        # What the pass/fail tests check: bytes against what the stamper's rates allow (tests/kernel/test_edt.py).
        "alone_s": alone_s, "both_s": both_s, "bronze_bytes_before_gold": bytes_before(bronze, alone_s),
        "gold_bytes": sum(gold.values()), "bronze_bytes": sum(bronze.values()),
        "gold_mbit": mbit(gold, alone_s + settle, end),
        "bronze_both_mbit": mbit(bronze, alone_s + settle, end),
        "convergence_s": conv,
        "sent": res["sent"], "packets": res["packets"],
        "bronze_until_s": res["sent_until_s"][0], "gold_until_s": res["sent_until_s"][1],
        "gold_series_mbit": [round(v, 2) for v in series],
    }
    out["guarantee_gold"] = out["gold_mbit"] / (GOLD["g"] * cap)
    out["guarantee_bronze"] = out["bronze_both_mbit"] / (BRONZE["g"] * cap)
    out["limit_excess_bronze"] = out["bronze_alone_mbit"] / (BRONZE["limit"] * cap) - 1
    out["utilisation"] = (out["gold_mbit"] + out["bronze_both_mbit"]) / cap
    return out


def status_step(bed: Bed, dataplane: str) -> dict:
    """``shaperd status -o json`` on the node after the isolation run: the edt rows (the controller's last rates)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "tenants.yaml"
        cfg.write_text(tenants_yaml(dataplane))
        # 120 s on a quiet machine (sh scales it by the guest's measured speed): under TCG the command's
        # imports over the shared 9p filesystem dominate (BENCHMARKS.md "status cost").
        t = time.monotonic()
        r = sh([sys.executable, "-m", "shaperd", "status", "-o", "json", "--netns", bed.node, "--config", str(cfg),
                "--interval", "0.2"], timeout=120.0, check=False)
        seconds = round(time.monotonic() - t, 2)  # recorded for BENCHMARKS.md "status cost", never asserted
    doc = json.loads(r.stdout.splitlines()[-1]) if r.stdout.strip() else {}
    return {"rc": r.returncode, "seconds": seconds, "stderr": r.stderr[-2000:], "edt": doc.get("edt"), "edt_errors": doc.get("edt_errors")}


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in cpu[:7])
    return user + nice + system + irq + softirq


def cpu_per_packet(bed: Bed, cfg, senders: int, seconds: float = 3.0, rec=None, dataplane: str = "") -> dict:
    """Busy CPU time / packets received, ``senders`` processes of gold sending 64-byte datagrams.

    With ``rec`` and dataplane edt the rate controller runs meanwhile (its CPU is counted), as in the daemon.
    """
    ids = classids(cfg)
    loop = None
    if rec is not None and dataplane == "edt":
        from shaperd.backends.edt.loop import maps_opener as _edt_maps_opener
        from shaperd.backends.edt.loop import EdtLoop

        loop = EdtLoop(_edt_maps_opener(bed.node))
        loop.set_targets(rec.plan(cfg).desired["edt"].devices)
        loop.start()
    flows = [(GOLD["port"], ids["gold"], 0.0, seconds) for _ in range(senders)]
    # Busy time over the traffic window, sampled from a thread on the traffic's own schedule.
    sample: dict = {}
    threads = []

    def sampler(t0: float):
        time.sleep(max(0.0, t0 - time.monotonic()))
        sample["j0"] = busy_jiffies()
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        sample["j1"] = busy_jiffies()

    def on_start(t0: float):
        threads.append(threading.Thread(target=sampler, args=(t0,)))
        threads[0].start()

    try:
        res = traffic(bed, flows, seconds + 0.5, size=64, on_start=on_start)
    finally:
        if loop is not None:
            loop.stop()
    for th in threads:
        th.join()
    hz = os.sysconf("SC_CLK_TCK")
    pkts = sum(res["packets"].values())
    busy_s = (sample["j1"] - sample["j0"]) / hz
    sent = sum(res["sent"])
    return {"senders": senders, "packets": pkts, "busy_s": busy_s,
            "us_per_packet": busy_s * 1e6 / pkts if pkts else None, "sent": res["sent"],
            "us_per_sent_packet": busy_s * 1e6 / sent if sent else None}


def attempt(out: dict, key: str, fn):
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001 - recorded for the host to judge
        out.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    return out.get(key)


KIND_ASK = """
import json, subprocess, sys
from shaperd.kernel import kind_ask
lo = lambda: subprocess.run(["tc", "-j", "qdisc", "show", "dev", "lo"], capture_output=True, text=True, timeout=30).stdout
before = lo()
got = {k: [a.state, a.detail] for k, a in ((k, kind_ask.ask(k)) for k in ("fq", "htb"))}
print(json.dumps({"answers": got, "lo_before": before, "lo_after": lo()}))
"""


def kind_ask_step() -> dict:
    """The probe's question to the kernel (kernel/kind_ask.py) on Debian's 6.1, which has sch_fq: in a fresh
    network namespace (unshare --net), under NET_ADMIN only; lo's qdiscs before and after."""
    r = sh(["unshare", "--net", "setpriv", "--bounding-set=-all,+net_admin", "--inh-caps=-all", sys.executable, "-c",
            KIND_ASK], timeout=60)
    return json.loads(r.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pod-caps", action="store_true", help="with --bench: only the per-pod cap scenario")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests import edt_cases

    out: dict = {"uname": os.uname().release}
    from . import guest_speed

    if guest_speed.ENV not in os.environ:  # run on its own (bench/edt_qemu.py), not by guest_main: calibrate here
        out["calibration"] = guest_speed.calibrate()
        os.environ[guest_speed.ENV] = str(out["calibration"]["factor"])
    if not args.bench:  # first, before anything here loads sch_fq: the daemon's probe reads evidence of it
        from .edt_caps_guest import least_caps

        args.outdir.mkdir(parents=True, exist_ok=True)
        attempt(out, "least_caps", lambda: least_caps(args.outdir))
    sh(["modprobe", "sch_fq"], check=False)
    if not args.bench:
        attempt(out, "kind_ask", kind_ask_step)
    attempt(out, "cases", edt_cases.run_cases)
    from .edt_pods_guest import pod_caps

    if not args.bench:
        with Bed() as bed:
            attempt(out, "switch", lambda: switch_step(bed))
        with Bed() as bed:
            attempt(out, "pod_caps", lambda: pod_caps(bed))
    elif args.pod_caps:
        for r in range(args.repeats):
            with Bed() as bed:
                attempt(out, f"pod_caps_{r}", lambda: pod_caps(bed))
    planes = () if args.bench and args.pod_caps else ("edt", "htb") if args.bench else ("edt",)
    for dp in planes:
        for r in range(args.repeats):
            with Bed() as bed:
                got = attempt(out, f"apply_{dp}_{r}", lambda: apply_step(bed, dp))
                if got is None:
                    continue
                out[f"apply_{dp}_{r}"], cfg, rec = got
                attempt(out, f"isolation_{dp}_{r}", lambda: isolation(bed, cfg, rec, dp))
                attempt(out, f"status_{dp}_{r}", lambda: status_step(bed, dp))
                if args.bench and r == 0:
                    for n in (1, 2, 4):
                        attempt(out, f"cpu_{dp}_{n}", lambda: cpu_per_packet(bed, cfg, n))
                    # The same at 10 Gbit/s of capacity: nothing waits for its departure time (no pacing timers).
                    from shaperd.core import config as _config

                    fast = _config.load_text(tenants_yaml(dp, capacity_mbit=10_000))
                    attempt(out, f"apply_fast_{dp}", lambda: rec.apply(fast).ok)
                    for n in (1, 2, 4):
                        attempt(out, f"cpufast_{dp}_{n}", lambda: cpu_per_packet(bed, fast, n, rec=rec, dataplane=dp))
    out["loadavg"] = Path("/proc/loadavg").read_text().strip()
    args.outdir.mkdir(parents=True, exist_ok=True)
    (args.outdir / "edt.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
