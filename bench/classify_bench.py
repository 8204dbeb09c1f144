#!/usr/bin/env python3
"""Benchmark (issue 11): classification cost vs number of prefixes, big applies, one-prefix updates, a per-pod class.

    sudo .venv/bin/python bench/classify_bench.py pps [--repeats 3] [--duration 5]
    sudo .venv/bin/python bench/classify_bench.py apply [--prefixes 50000] [--runs 3]
    sudo .venv/bin/python bench/classify_bench.py add-one [--prefixes 50000] [--runs 5]
    sudo .venv/bin/python bench/classify_bench.py daemon [--prefixes 50000] [--runs 2]
    sudo .venv/bin/python bench/classify_bench.py testrun [--prefixes 0,500,5000,50000]
    sudo .venv/bin/python bench/classify_bench.py podcap [--repeats 3] [--duration 5] [--path ebpf,u32]

pps: 64-byte UDP payloads sent by one Python sender in a node namespace from
198.18.0.1 (an address of no tenant, so every classifier is consulted)
through uplink veth up0 to a peer namespace; packets/s = the peer's
rx_packets delta over the sending time. Capacity 100Gbit, so nothing is
rate-limited. Configurations: no qdisc; eBPF map classifier with 64 tenants
x 500 / 5,000 / 50,000 prefixes; u32 (SHAPERD_CLASSIFIER=u32 equivalent:
capabilities with bpf_maps off) at 500 and 2,000.

apply: first apply of 64 tenants x N prefixes in-process (Reconciler.apply on
a fresh device) and as a whole process (`shaperd apply --netns`, ru_maxrss),
the in-sync resync (must make 0 changes), and `tc -batch` of the u32
equivalent (render.device_commands of the u32 plan) with a deadline.

add-one: on a device carrying N prefixes, one more /32 is added to a
tenant's config; times config-apply -> first packet from that address
counted in the tenant's HTB class, and counts the kernel writes the apply
sent (bpf() write commands and netlink requests, by wrapping both).

testrun: the program's own cost per packet as the kernel measures it
(BPF_PROG_TEST_RUN with repeat), independent of the sender and of HTB.

podcap: the per-packet cost of a per-pod class (kubernetes.io/egress-bandwidth).
The same sender and bed as pps, its address 198.18.0.1 the one address of a
"pod" of tenant-0 (8 tenants, capacity 100Gbit, tenant-0 10..90Gbit): once
unannotated, so its packets go through the tenant's leaf, and once annotated
50G, so they go through the pod's own leaf under the tenant's (now inner)
class (and its rest leaf beside it); both on the eBPF map classifier and on
u32, configurations interleaved within each repeat. No cap is reached (50G and
90G are far above what one sender makes), so the difference is the cost of the
deeper class tree and of the pod's entries.

daemon: `shaperd run` on that config: start -> first "reconciled" line, the
next resyncs' durations and changes, and the daemon's VmRSS / VmHWM.

Every child runs in its own process group with a deadline; namespaces are
removed on exit. Prints JSON lines and a markdown summary; records
/proc/loadavg beside every figure. Nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from shaperd_bed import netns  # noqa: E402

SENDER = r"""
import socket, sys, time
src, dst, size, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
payload = b"x" * size
end = time.monotonic() + dur
n = 0
while True:
    for _ in range(256):
        try:
            s.sendto(payload, (dst, 9))
        except OSError:
            pass
    n += 256
    if time.monotonic() >= end:
        break
print(n)
"""


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_prefixes(n: int) -> list[str]:
    """n distinct source prefixes none of which covers 198.18.0.0/24 (the bench's own addresses):
    10 % IPv6 /64, of the IPv4 up to 2,000 /28s in 198.18.128.0/17, the rest /32s from 198.19.0.0/16."""
    n6 = n // 10
    n4 = n - n6
    n28 = min(2000, n4 // 10)
    n32 = n4 - n28
    if n32 > 65536:
        raise ValueError(f"{n} prefixes do not fit the bench's ranges")
    base28 = int(ipaddress.ip_address("198.18.128.0"))
    base32 = int(ipaddress.ip_address("198.19.0.0"))
    v6 = int(ipaddress.ip_address("2001:db8::"))
    out = [f"{ipaddress.IPv4Address(base28 + 16 * i)}/28" for i in range(n28)]
    out += [f"{ipaddress.IPv4Address(base32 + i)}/32" for i in range(n32)]
    out += [f"{ipaddress.IPv6Address(v6 + (i << 64))}/64" for i in range(n6)]
    return out


def config_dict(tenants: int, prefixes: int, device: str = "up0") -> dict:
    pfx = make_prefixes(prefixes)
    return {"node": {"interfaces": [device], "capacity": "100Gbps"},
            "tenants": [{"name": f"tenant-{i:02d}", "bandwidthGuarantee": "1Gbps", "priority": i % 7,
                         "match": {"cidrs": pfx[i::tenants]}} for i in range(tenants)]}


class Bed:
    def __init__(self, tag: str):
        self.nets = netns.Namespaces(stop_grace_s=0)
        self.node, self.peer = self.nets.add(f"clsb{tag}-node"), self.nets.add(f"clsb{tag}-peer")
        netns.veth("up0", self.node, "up1", self.peer)
        netns.addr(self.node, "up0", "198.18.0.1/24")
        netns.addr(self.peer, "up1", "198.18.0.2/24", "198.19.255.254/16")
        netns.neigh(self.node, "up0", "198.18.0.2", netns.link(self.peer, "up1")["address"])

    def rx_packets(self) -> int:
        out = netns.run(("ip", "-s", "-j", "link", "show", "up1"), self.peer).stdout
        return json.loads(out)[0]["stats64"]["rx"]["packets"]

    def pps(self, duration_s: float, src: str = "198.18.0.1") -> tuple[float, int]:
        before = self.rx_packets()
        p = netns.run((sys.executable, "-c", SENDER, src, "198.18.0.2", "64", str(duration_s)), self.node,
                      timeout=duration_s + 60)
        sent = int(p.stdout.strip())
        got = self.rx_packets() - before
        return got / duration_s, sent

    def cleanup(self) -> None:
        self.nets.cleanup()


def caps_for(path: str):
    from shaperd.engine.probe import probe_capabilities

    caps = probe_capabilities()
    if path == "u32":
        caps = dataclasses.replace(caps, bpf_maps=False)
    elif not caps.bpf_maps:
        raise RuntimeError(f"eBPF map classifier unavailable here: {caps.notes}")
    return caps


def reconciler(bed: Bed, caps):
    from shaperd.engine.reconciler import open_node

    return open_node(caps, netns=bed.node)


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def cmd_pps(args) -> list[dict]:
    from shaperd.core import config as config_mod
    from shaperd.core import log

    log.configure(json=True, level="error")
    # "htb only": an HTB root with one default class and no classifier at all (set up with tc here, a
    # measurement fixture, not enforcement): separates HTB's own fixed cost from the classifier's.
    configs = [("no qdisc", None, 0), ("htb only", "htb-only", 0), ("ebpf", "ebpf", 0), ("ebpf", "ebpf", 500), ("ebpf", "ebpf", 5000), ("ebpf", "ebpf", 50000),
               ("u32", "u32", 500), ("u32", "u32", 2000)]
    if args.only:
        configs = [c for c in configs if f"{c[0]}:{c[2]}" in args.only.split(",")]
    results = []
    bed = Bed(str(os.getpid() % 10000))
    try:
        for rep in range(args.repeats):
            for label, path, n in configs:
                netns.run(("tc", "qdisc", "del", "dev", "up0", "root"), bed.node, check=False)
                netns.run(("tc", "qdisc", "del", "dev", "up0", "clsact"), bed.node, check=False)
                apply_s = None
                if path == "htb-only":
                    netns.run(("tc", "qdisc", "add", "dev", "up0", "root", "handle", "1:", "htb", "default", "2"), bed.node)
                    netns.run(("tc", "class", "add", "dev", "up0", "parent", "1:", "classid", "1:2", "htb",
                               "rate", "100gbit"), bed.node)
                elif path is not None:
                    cfg = config_mod.from_dict(config_dict(64, n))
                    rec = reconciler(bed, caps_for(path))
                    t = time.perf_counter()
                    r = rec.apply(cfg)
                    apply_s = time.perf_counter() - t
                    if not r.ok:
                        raise RuntimeError(f"apply {label} {n}: not ok")
                bed.pps(0.5)  # warm-up
                la = loadavg()
                pps, sent = bed.pps(args.duration)
                row = {"bench": "pps", "config": label, "prefixes": n, "repeat": rep, "pps": round(pps),
                       "sent_pps": round(sent / args.duration), "apply_s": apply_s, "loadavg": la}
                print(json.dumps(row), flush=True)
                results.append(row)
    finally:
        bed.cleanup()
    base = [r["pps"] for r in results if r["config"] == "no qdisc"]
    print("\n| configuration | packets/s received, median (min..max) | vs no qdisc (median) | loadavg during runs |")
    print("|---|---|---|---|")
    for label, _, n in configs:
        xs = [r["pps"] for r in results if r["config"] == label and r["prefixes"] == n]
        s = summary(xs)
        loads = ", ".join(r["loadavg"].split()[0] for r in results if r["config"] == label and r["prefixes"] == n)
        name = label if label in ("no qdisc", "htb only") else f"shaperd {label}, 64 tenants, {n:,} prefixes"
        ratio = s["median"] / statistics.median(base) if base else float("nan")
        print(f"| {name} | {s['median']:,.0f} ({s['min']:,.0f}..{s['max']:,.0f}) | {ratio:.2f} | {loads} |")
    return results


def podcap_config() -> dict:
    return {"node": {"interfaces": ["up0"], "capacity": "100Gbps"},
            "tenants": [{"name": f"tenant-{i}", "bandwidthGuarantee": "10Gbps", "bandwidthLimit": "90Gbps",
                         "priority": i % 3, "match": {"namespaces": [f"team-{i}"]}} for i in range(8)]}


def podcap_pod(egress: str | None):
    """The sender's address as the one address of a pod of tenant-0 (what the watcher would hand over)."""
    from shaperd.discovery.kubernetes import PodInfo
    from tests.k8s_fake import make_pod

    obj = make_pod("sender-0", "node-1", namespace="team-0", ips=("198.18.0.1",),
                   uid="00000000-0000-4000-8000-0000000000bb")
    if egress is not None:
        obj["metadata"]["annotations"] = {"kubernetes.io/egress-bandwidth": egress}
    return PodInfo.from_dict(obj)


def cmd_podcap(args) -> list[dict]:
    from shaperd.core import config as config_mod
    from shaperd.core import log
    from shaperd.engine.reconciler import open_node

    log.configure(json=True, level="error")
    cfg = config_mod.from_dict(podcap_config())
    configs = [(path, leaf) for path in args.path.split(",") for leaf in ("tenant leaf", "pod leaf")]
    results = []
    bed = Bed(str(os.getpid() % 10000))
    try:
        for rep in range(args.repeats):
            for path, leaf in configs:
                for what in ("root", "clsact"):
                    netns.run(("tc", "qdisc", "del", "dev", "up0", what), bed.node, check=False)
                pod = podcap_pod("50G" if leaf == "pod leaf" else None)
                rec = open_node(caps_for(path), netns=bed.node, pods_source=lambda pod=pod: [pod])
                r = rec.apply(cfg)
                htb = r.plan.desired["htb"]
                if not r.ok or (leaf == "pod leaf") != bool(htb.pods):
                    raise RuntimeError(f"apply {path} {leaf}: not ok or not the tree measured")
                # The leaf the packets must go through: the pod's own, or the tenant's.
                through = htb.pods[0].classid if htb.pods else htb.devices[0].tenant_classes["tenant-0"]
                bed.pps(0.5)  # warm-up
                la = loadavg()
                before = class_packets(bed, through)
                pps, sent = bed.pps(args.duration)
                row = {"bench": "podcap", "path": path, "leaf": leaf, "repeat": rep, "pps": round(pps),
                       "sent_pps": round(sent / args.duration), "classes": len(htb.devices[0].classes),
                       "through_class_packets": class_packets(bed, through) - before, "loadavg": la}
                print(json.dumps(row), flush=True)
                results.append(row)
    finally:
        bed.cleanup()
    print("\n| classifier | through | packets/s received, median (min..max) | vs the tenant leaf (median) | loadavg |")
    print("|---|---|---|---|---|")
    for path, leaf in configs:
        xs = [r["pps"] for r in results if r["path"] == path and r["leaf"] == leaf]
        base = [r["pps"] for r in results if r["path"] == path and r["leaf"] == "tenant leaf"]
        s = summary(xs)
        loads = ", ".join(r["loadavg"].split()[0] for r in results if r["path"] == path and r["leaf"] == leaf)
        print(f"| {path} | {leaf} | {s['median']:,.0f} ({s['min']:,.0f}..{s['max']:,.0f}) | "
              f"{s['median'] / statistics.median(base):.3f} | {loads} |")
    return results


def run_child(argv: list[str], timeout_s: float) -> tuple[float, int, int | None, str]:
    """(wall s, returncode, child ru_maxrss KiB, stderr tail); own process group, killed at the deadline."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        return time.perf_counter() - t, -9, None, "timeout"
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, p.returncode, rss, err[-300:]


def cmd_apply(args) -> list[dict]:
    import yaml

    from shaperd.core import config as config_mod
    from shaperd.core import log
    from shaperd.backends.htb.render import device_commands

    log.configure(json=True, level="error")
    doc = config_dict(64, args.prefixes)
    cfg = config_mod.from_dict(doc)
    work = tempfile.mkdtemp(prefix="shaperd-clsbench-")
    cfg_file = os.path.join(work, "tenants.yaml")
    with open(cfg_file, "w") as f:
        yaml.safe_dump(doc, f)
    results = []
    bed = Bed(str(os.getpid() % 10000))
    try:
        caps = caps_for("ebpf")
        for i in range(args.runs):
            for what in ("root", "clsact"):
                netns.run(("tc", "qdisc", "del", "dev", "up0", what), bed.node, check=False)
            rec = reconciler(bed, caps)
            la = loadavg()
            t = time.perf_counter()
            r = rec.apply(cfg)
            first = time.perf_counter() - t
            assert r.ok, "first apply not ok"
            t = time.perf_counter()
            r2 = rec.apply(cfg)
            resync = time.perf_counter() - t
            row = {"bench": "apply", "prefixes": args.prefixes, "run": i, "first_apply_s": round(first, 3),
                   "first_changes": r.changes, "resync_s": round(resync, 3), "resync_changes": r2.changes,
                   "maxrss_kib_in_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "loadavg": la}
            print(json.dumps(row), flush=True)
            results.append(row)
        # Whole process, on a fresh device each time.
        for i in range(args.runs):
            for what in ("root", "clsact"):
                netns.run(("tc", "qdisc", "del", "dev", "up0", what), bed.node, check=False)
            la = loadavg()
            wall, rc, rss, err = run_child([sys.executable, "-m", "shaperd", "--log-json", "apply", "--netns",
                                            bed.node, "--config", cfg_file], 600)
            row = {"bench": "cli_apply", "prefixes": args.prefixes, "run": i, "wall_s": round(wall, 3), "rc": rc,
                   "children_maxrss_kib": rss, "loadavg": la, "err": err if rc else ""}
            print(json.dumps(row), flush=True)
            results.append(row)
        # tc -batch of the u32 equivalent (one run: it is slow).
        if args.tc_batch:
            from shaperd.engine.reconciler import open_node

            u32caps = caps_for("u32")
            dp = open_node(u32caps, netns=bed.node).plan(cfg).desired["htb"].device("up0")
            batch = os.path.join(work, "u32.batch")
            with open(batch, "w") as f:
                f.writelines(" ".join(c) + "\n" for c in device_commands(dp))
            for what in ("root", "clsact"):
                netns.run(("tc", "qdisc", "del", "dev", "up0", what), bed.node, check=False)
            la = loadavg()
            wall, rc, _, err = run_child(["tc", "-n", bed.node, "-batch", batch], args.tc_timeout)
            shown = netns.run(("tc", "filter", "show", "dev", "up0"), bed.node, timeout=120).stdout
            installed = shown.count("flowid")  # one per u32 filter node
            row = {"bench": "tc_batch_u32", "prefixes": args.prefixes, "filters": len(dp.filters),
                   "filters_installed": installed,
                   "wall_s": round(wall, 3), "rc": rc, "loadavg": la, "err": err if rc else ""}
            print(json.dumps(row), flush=True)
            results.append(row)
    finally:
        bed.cleanup()
    return results


def class_packets(bed: Bed, classid: int) -> int:
    # iproute2 6.1 prints classes as text even with -j: parse "class htb H ... Sent B bytes P pkt".
    import re

    out = netns.run(("tc", "-s", "class", "show", "dev", "up0", "classid",
                     f"{classid >> 16:x}:{classid & 0xFFFF:x}"), bed.node).stdout
    m = re.search(r"Sent \d+ bytes (\d+) pkt", out)
    return int(m.group(1)) if m else 0


def cmd_add_one(args) -> list[dict]:
    from shaperd.core import config as config_mod
    from shaperd.core import log
    from shaperd.backends.common.objects import ROOT_HANDLE
    from shaperd.core.ids import assign_minors
    from shaperd.kernel import bpf_maps

    log.configure(json=True, level="error")
    doc = config_dict(64, args.prefixes)
    minors = assign_minors([t["name"] for t in doc["tenants"]])
    cid = ROOT_HANDLE | minors["tenant-00"]
    results = []
    bed = Bed(str(os.getpid() % 10000))
    counts = {"bpf_writes": 0, "netlink": 0}
    real_bpf = bpf_maps._bpf
    writes = {0, 2, 3, 5, 26, 27}

    def counting_bpf(cmd, attr):
        if cmd in writes:
            counts["bpf_writes"] += 1
        return real_bpf(cmd, attr)

    bpf_maps._bpf = counting_bpf
    try:
        rec = reconciler(bed, caps_for(args.path))
        htb = next(b for b in rec.backends if b.name == "htb")
        real_req = htb.writer.nlm_request_batch

        def counting_req(msgs, *a, **kw):
            counts["netlink"] += len(msgs)
            return real_req(msgs, *a, **kw)

        htb.writer.nlm_request_batch = counting_req
        assert rec.apply(config_mod.from_dict(doc)).ok
        for i in range(args.runs):
            ip = f"198.18.0.{100 + i}"  # on up0's /24: the node may send from it
            netns.addr(bed.node, "up0", f"{ip}/32")
            doc["tenants"][0]["match"]["cidrs"].append(f"{ip}/32")
            cfg = config_mod.from_dict(doc)
            before = class_packets(bed, cid)
            counts.update(bpf_writes=0, netlink=0)
            la = loadavg()
            t0 = time.perf_counter()
            r = rec.apply(cfg)
            t_apply = time.perf_counter() - t0
            w = dict(counts)
            deadline = time.perf_counter() + 10
            while class_packets(bed, cid) <= before and time.perf_counter() < deadline:
                netns.run((sys.executable, "-c", SENDER, ip, "198.18.0.2", "64", "0.001"), bed.node)
            t_cls = time.perf_counter() - t0
            row = {"bench": "add_one", "path": args.path, "prefixes": args.prefixes, "run": i, "changes": r.changes,
                   "apply_s": round(t_apply, 4), "apply_to_classified_s": round(t_cls, 4),
                   "bpf_writes": w["bpf_writes"], "netlink_requests": w["netlink"], "loadavg": la}
            print(json.dumps(row), flush=True)
            results.append(row)
    finally:
        bpf_maps._bpf = real_bpf
        bed.cleanup()
    return results


def cmd_daemon(args) -> list[dict]:
    """`shaperd run` with 64 x N prefixes: time to the first reconciled line, then VmRSS/VmHWM of the daemon."""
    import yaml

    doc = config_dict(64, args.prefixes)
    work = tempfile.mkdtemp(prefix="shaperd-clsbench-")
    cfg_file = os.path.join(work, "tenants.yaml")
    with open(cfg_file, "w") as f:
        yaml.safe_dump(doc, f)
    results = []
    for i in range(args.runs):
        bed = Bed(str(os.getpid() % 10000))
        try:
            la = loadavg()
            t = time.perf_counter()
            p = bed.nets.spawn([sys.executable, "-m", "shaperd", "--log-json", "run", "--config", cfg_file,
                                "--resync-interval", "5", "--metrics-address", "127.0.0.1:0"], bed.node,
                               deadline_s=300, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            first = None
            resyncs = []
            for line in p.stdout:
                if '"reconciled"' not in line:
                    continue
                rec = json.loads(line)
                if first is None:
                    first = time.perf_counter() - t
                    first_rec = rec
                else:
                    resyncs.append(rec)
                    if len(resyncs) >= 2:
                        break
            status = {}
            with open(f"/proc/{p.pid}/status") as f:
                for ln in f:
                    k, _, v = ln.partition(":")
                    if k in ("VmRSS", "VmHWM"):
                        status[k] = int(v.split()[0])
            row = {"bench": "daemon", "prefixes": args.prefixes, "run": i, "start_to_first_reconciled_s":
                   round(first, 3), "first_changes": first_rec.get("changes"),
                   "first_duration_ms": first_rec.get("duration_ms"),
                   "resync_duration_ms": [r.get("duration_ms") for r in resyncs],
                   "resync_changes": [r.get("changes") for r in resyncs],
                   "vmrss_kib": status.get("VmRSS"), "vmhwm_kib": status.get("VmHWM"), "loadavg": la}
            print(json.dumps(row), flush=True)
            results.append(row)
        finally:
            bed.cleanup()
    return results


def cmd_testrun(args) -> list[dict]:
    """The classifier program's own cost per packet, measured by the kernel (BPF_PROG_TEST_RUN, repeat=N),
    for 64 tenants x N prefixes: a packet of no tenant (every stage misses) and one matching a /32."""
    import socket
    import struct

    from shaperd.backends.common import mapcls
    from shaperd.core.ids import assign_minors
    from shaperd.backends.common import kernel_classifier as bpf_classify
    from shaperd.kernel import bpf_maps

    def frame(src: str) -> bytes:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, socket.inet_aton(src),
                         socket.inet_aton("198.18.0.2"))
        return b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + ip + bytes(26)

    results = []
    for n in [int(x) for x in args.prefixes.split(",")]:
        pfx = make_prefixes(n) if n else []
        minors = assign_minors([f"tenant-{i:02d}" for i in range(64)])
        prefixes = {ipaddress.ip_network(p): 0x73680000 | minors[f"tenant-{i % 64:02d}"] for i, p in enumerate(pfx)}
        want, _ = mapcls.build(0xFF, {}, (), {}, prefixes)
        with bpf_classify.ClassifierMaps.create() as maps:
            for role, entries in want.entries.items():
                maps.write(role, list(entries.items()), [])
            fd = bpf_classify.load(maps, 0xFF, want.name)
            try:
                hit = next((p.split("/")[0] for p in pfx if p.endswith("/32")), "198.18.0.1")
                # near miss: inside 198.19.0.0/16 where the /32s are, but not one of them (a deep trie walk)
                for label, src in (("no tenant", "198.18.0.1"), ("no tenant, near miss", "198.19.255.1"),
                                   ("matches a /32", hit)):
                    ns = []
                    for _ in range(args.repeats):
                        la = loadavg()
                        r = bpf_maps.test_run(fd, frame(src), bpf_maps.SkBuff(), repeat=args.count)
                        ns.append(r.duration_ns)
                    row = {"bench": "testrun", "prefixes": n, "packet": label, "ns_per_packet": ns,
                           "median_ns": statistics.median(ns), "loadavg": la}
                    print(json.dumps(row), flush=True)
                    results.append(row)
            finally:
                os.close(fd)
    print("\n| prefixes | packet | ns per packet, median (min..max) of runs |")
    print("|---|---|---|")
    for r in results:
        print(f"| {r['prefixes']:,} | {r['packet']} | {r['median_ns']:.0f} ({min(r['ns_per_packet'])}.."
              f"{max(r['ns_per_packet'])}) |")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--only", default="", help="e.g. 'no qdisc:0,ebpf:50000'")
    p = sub.add_parser("apply")
    p.add_argument("--prefixes", type=int, default=50000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-tc-batch", dest="tc_batch", action="store_false")
    p.add_argument("--tc-timeout", type=float, default=300.0)
    p = sub.add_parser("add-one")
    p.add_argument("--prefixes", type=int, default=50000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--path", default="ebpf", choices=["ebpf", "u32"])
    p = sub.add_parser("testrun")
    p.add_argument("--prefixes", default="0,500,5000,50000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--count", type=int, default=200000)
    p = sub.add_parser("daemon")
    p.add_argument("--prefixes", type=int, default=50000)
    p.add_argument("--runs", type=int, default=2)
    p = sub.add_parser("podcap")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--path", default="ebpf,u32", help="classifier paths, comma-separated (ebpf, u32)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("classify_bench: needs root", file=sys.stderr)
        return 2
    {"pps": cmd_pps, "apply": cmd_apply, "add-one": cmd_add_one, "daemon": cmd_daemon, "testrun": cmd_testrun,
     "podcap": cmd_podcap}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
