#!/usr/bin/env python3
"""Benchmark (not CI): a long soak of pod churn and traffic through the real daemon (issue 14).

    sudo .venv/bin/python bench/soak.py [--duration-s 3600] [--steady 20] [--sample-every-s 60]
                                        [--window-s 300] [--pause-s 0.5] [--traffic-mbit 50]
                                        [--out soak.json] [--keep-log PATH]

Owns: the soak's bed (bench/pod_churn.py's node, uplink and steady routed pods,
plus one *traffic pod* with a real address in its own namespace), a TCP
iperf3 stream from that pod through the node's shaped uplink for the whole run,
pod create/delete cycles through the fake Kubernetes API (tests/k8s_fake.py)
until the duration is over, and the figures: the daemon's RSS, USS, open fds
and threads every ``--sample-every-s``; per ``--window-s`` window the p50/p99
of the daemon's reconcile durations (its "reconciled" log events) and of
create-to-enforced; the traffic pod's tenant class byte counter (it must keep
growing: enforcement continues under churn). Must not: assert (it reports),
leave anything behind (namespaces and processes through shaperd_bed.netns,
own process groups, deadlines).

The JSON document is rewritten after every sample (``--out``), so a run cut
short still has its figures. Exit code 0 unless the bed could not be built.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _signals import sigterm_as_exit  # noqa: E402
from pod_churn import Daemon, slope, summary, wait_until  # noqa: E402

from shaperd_bed import netns  # noqa: E402
from tests.routed_pods import (NODE_NAME, Kernel, PodSpec, add_routed_pods, build_node, enforced,  # noqa: E402
                               gone, remove_routed_pod, tenant_for)

TRAFFIC_IP4 = "198.19.9.1"  # outside the steady/trial/churn pools of tests/routed_pods.py
IPERF_PORT = 5219


class LogTail:
    """Incremental reader of the daemon's JSON log: the "reconciled" events since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_reconciles(self) -> list[dict]:
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()  # an unfinished last line waits for the next call
        out = []
        for line in lines:
            if '"reconciled"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == "reconciled":
                out.append(rec)
        return out


def add_traffic_pod(nets: netns.Namespaces, node: str, peer: str, tag: str) -> tuple[str, PodSpec]:
    """A pod with a real address (its own namespace, Calico style: /32, default route on its veth, proxy
    ARP on the host side), in tenant-a by label, and the peer's route back to it."""
    pod = PodSpec("s", 900, "tenant-a", ip4=TRAFFIC_IP4, ip6="2001:db8:19:9::1")
    tpod = nets.add(f"{tag}-tpod")
    netns.batch(node, [f"link add {pod.host_if} type veth peer name eth0 netns {tpod}",
                       f"link set {pod.host_if} up",
                       f"route add {pod.ip4}/32 dev {pod.host_if} scope link",
                       f"route add {pod.ip6}/128 dev {pod.host_if}"])
    netns.run(["sysctl", "-qw", f"net.ipv4.conf.{pod.host_if}.proxy_arp=1"], node)
    netns.batch(tpod, ["link set eth0 up", f"addr add {pod.ip4}/32 dev eth0", "route add default dev eth0"])
    netns.run(["ip", "-n", peer, "route", "add", "198.19.0.0/16", "via", "198.18.0.1"])
    return tpod, pod


def class_bytes(node: str, classid: str) -> int | None:
    """Sent bytes of HTB class *classid* on up0 (``tc -s class show``, read-only; iproute2 6.1 has no JSON
    for HTB classes)."""
    out = netns.run(["tc", "-s", "class", "show", "dev", "up0"], node, check=False).stdout
    m = re.search(rf"^class htb {re.escape(classid)} .*?\n\s*Sent (\d+) bytes", out, re.M)
    return int(m.group(1)) if m else None


def soak(args, workdir: Path, doc: dict, write) -> None:
    from tests.k8s_fake import FakeKubeAPI

    from shaperd.core.ids import assign_minors

    tag = f"shps{os.getpid() % 100000}"
    with netns.Namespaces() as nets:
        node, peer, pods_ns = build_node(nets, tag)
        steady = [PodSpec("s", i, tenant_for(i)) for i in range(args.steady)]
        add_routed_pods(node, pods_ns, steady)
        tpod_ns, tpod = add_traffic_pod(nets, node, peer, tag)
        minor = assign_minors(["tenant-a", "tenant-b"])["tenant-a"]
        classid = f"7368:{minor:x}"
        api = FakeKubeAPI()
        k = Kernel(node)
        daemon = None
        procs = netns.Processes()
        try:
            for p in [*steady, tpod]:
                api.add_pod(p.api_object())
            daemon = Daemon(node, workdir, api.url, 0)
            daemon.wait_ready()
            if not wait_until(lambda: all(enforced(k, p) for p in [*steady, tpod] if p.tenant), 60, 0.05):
                raise RuntimeError("steady pods never enforced\n" + daemon.tail())
            deadline = args.duration_s + 120
            procs.spawn(["iperf3", "-s", "-p", str(IPERF_PORT), "-1"], peer, deadline_s=deadline,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # not synchronisation of a result: iperf3 -c retries below if the server is late
            client = None
            for _ in range(20):
                client = procs.spawn(["iperf3", "-c", "198.18.0.2", "-p", str(IPERF_PORT), "-t",
                                      str(int(args.duration_s)), "-b", f"{args.traffic_mbit}M", "-J"],
                                     tpod_ns, deadline_s=deadline)
                time.sleep(0.5)
                if client.poll() is None:
                    break
            logtail = LogTail(daemon.log_path)
            doc["bed"] = {"node_ns": node, "classid": classid, "traffic_mbit": args.traffic_mbit,
                          "steady": args.steady}
            windows: list[dict] = []
            win = {"start_s": 0.0, "reconcile_ms": [], "enforce_ms": [], "cycles": 0, "timeouts": 0}
            samples = doc["samples"]
            start = time.monotonic()
            bytes0 = class_bytes(node, classid)
            samples.append({"t": 0.0, "cycles": 0, "class_bytes": bytes0, "load": _loadavg(), **daemon.memory()})
            next_sample = args.sample_every_s
            cycles = timeouts = 0
            c = 0
            while time.monotonic() - start < args.duration_s:
                c += 1
                pod = PodSpec("c", c, "tenant-a" if c % 2 else "tenant-b")
                add_routed_pods(node, pods_ns, [pod])
                t_add = time.perf_counter()
                api.add_pod(pod.api_object())
                if wait_until(lambda: enforced(k, pod), 10):
                    win["enforce_ms"].append((time.perf_counter() - t_add) * 1000)
                else:
                    win["timeouts"] += 1
                    timeouts += 1
                api_first = c % 2 == 0
                if not api_first:
                    remove_routed_pod(node, pod)
                    k.forget(pod.host_if)
                api.delete_pod(pod.uid)
                if not wait_until(lambda: gone(k, pod, api_first), 10):
                    win["timeouts"] += 1
                    timeouts += 1
                if api_first:
                    remove_routed_pod(node, pod)
                    k.forget(pod.host_if)
                cycles += 1
                win["cycles"] += 1
                time.sleep(args.pause_s)  # churn rate, not synchronisation
                now = time.monotonic() - start
                if now >= next_sample or now >= args.duration_s:
                    next_sample += args.sample_every_s
                    win["reconcile_ms"] += [r.get("duration_ms", 0.0) for r in logtail.new_reconciles()]
                    b = class_bytes(node, classid)
                    samples.append({"t": now, "cycles": cycles, "class_bytes": b, "load": _loadavg(),
                                    "iperf_alive": client is not None and client.poll() is None,
                                    **daemon.memory()})
                    if now - win["start_s"] >= args.window_s or now >= args.duration_s:
                        windows.append(_close_window(win, now))
                        win = {"start_s": now, "reconcile_ms": [], "enforce_ms": [], "cycles": 0, "timeouts": 0}
                    doc["windows"] = windows
                    doc["cycles"], doc["timeouts"] = cycles, timeouts
                    doc["elapsed_s"] = now
                    write()
                    print(f"  t={now:6.0f}s cycles {cycles} rss {samples[-1]['rss'] / 2**20:.1f} MiB "
                          f"fds {samples[-1]['fds']} class bytes {b} load {samples[-1]['load']}",
                          file=sys.stderr, flush=True)
            if win["cycles"]:
                win["reconcile_ms"] += [r.get("duration_ms", 0.0) for r in logtail.new_reconciles()]
                windows.append(_close_window(win, time.monotonic() - start))
            doc["windows"], doc["cycles"], doc["timeouts"] = windows, cycles, timeouts
            doc["elapsed_s"] = time.monotonic() - start
            doc["end_state"] = {"steady_enforced": all(enforced(k, p) for p in [*steady, tpod] if p.tenant),
                                "churn_filters_left": len(k.u32_on_uplink()) - 2 * len(
                                    [p for p in [*steady, tpod] if p.tenant])}
            if client is not None:
                try:
                    out, _ = client.communicate(timeout=60)
                    rep = json.loads(out or "{}")
                    end = rep.get("end", {}).get("sum_sent", {})
                    doc["iperf"] = {"bytes": end.get("bytes"), "bits_per_second": end.get("bits_per_second"),
                                    "seconds": end.get("seconds"), "error": rep.get("error")}
                except (subprocess.TimeoutExpired, ValueError) as e:
                    doc["iperf"] = {"error": str(e)}
            doc["daemon_exit"] = daemon.stop()
        finally:
            if daemon is not None and daemon.proc.poll() is None:
                daemon.stop()
            procs.stop_all()
            api.close()
            k.close()
            if args.keep_log and daemon is not None and daemon.log_path.exists():
                Path(args.keep_log).write_text(daemon.log_path.read_text())


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _close_window(win: dict, end_s: float) -> dict:
    rs, es = summary(win["reconcile_ms"]), summary(win["enforce_ms"])
    return {"start_s": round(win["start_s"]), "end_s": round(end_s), "cycles": win["cycles"],
            "timeouts": win["timeouts"], "reconciles": rs.get("n", 0),
            "reconcile_ms_p50": rs.get("median"), "reconcile_ms_p99": rs.get("p99"),
            "reconcile_ms_max": rs.get("max"),
            "enforce_ms_p50": es.get("median"), "enforce_ms_p99": es.get("p99")}


def finish(doc: dict) -> None:
    s = doc.get("samples", [])
    if len(s) >= 2:
        warm = [x for x in s if x["t"] >= min(300.0, s[-1]["t"] / 4)] or s
        doc["memory"] = {
            "rss_start_mib": s[0]["rss"] / 2**20, "rss_warm_mib": warm[0]["rss"] / 2**20,
            "rss_end_mib": s[-1]["rss"] / 2**20, "rss_max_mib": max(x["rss"] for x in s) / 2**20,
            "rss_slope_kib_per_h_after_warmup": slope([x["t"] for x in warm], [x["rss"] / 1024 for x in warm]) * 3600,
            "uss_slope_kib_per_h_after_warmup": slope([x["t"] for x in warm], [x["uss"] / 1024 for x in warm]) * 3600,
            "fds": sorted({x["fds"] for x in s}), "threads": sorted({x["threads"] for x in s}),
            "class_bytes_monotonic": all((b["class_bytes"] or 0) >= (a["class_bytes"] or 0) for a, b in zip(s, s[1:])),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--sample-every-s", type=float, default=60.0)
    ap.add_argument("--window-s", type=float, default=300.0)
    ap.add_argument("--pause-s", type=float, default=0.5, help="sleep between churn cycles (default 0.5)")
    ap.add_argument("--traffic-mbit", type=int, default=50, help="iperf3 -b of the traffic pod (default 50)")
    ap.add_argument("--out", default="soak.json")
    ap.add_argument("--keep-log", metavar="PATH")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    from shaperd.core import log
    from shaperd.engine.probe import probe_capabilities

    log.configure(json=True, level="error")
    caps = probe_capabilities()
    if not caps.bpf:
        print("cls_bpf unavailable: no mark programs to churn", file=sys.stderr)
        return 2
    doc: dict = {"args": vars(args), "node": NODE_NAME, "kernel": os.uname().release, "samples": [],
                 "load_start": _loadavg()}
    out = Path(args.out)

    def write() -> None:
        finish(doc)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, out)

    with sigterm_as_exit(), tempfile.TemporaryDirectory(prefix="shpd-soak-") as tmp:
        try:
            soak(args, Path(tmp), doc, write)
        finally:
            doc["load_end"] = _loadavg()
            write()
    m = doc.get("memory", {})
    print(json.dumps({"cycles": doc.get("cycles"), "timeouts": doc.get("timeouts"), "memory": m,
                      "windows": doc.get("windows"), "iperf": doc.get("iperf"), "end_state": doc.get("end_state")},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
