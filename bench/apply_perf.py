#!/usr/bin/env python3
"""Benchmark: time and peak memory of a first apply and an in-sync resync.

The issue's scenario: 64 tenants and 500 source prefixes (IPv4 /24s and /32s
from 198.18.0.0/15, IPv6 /64s from 2001:db8::/32) on one device with
node.capacity 100Gbps, beside ``tc -batch`` of the very same objects, measured
in the same run.

    sudo /tmp/venv/bin/python bench/apply_perf.py [--runs N] [--json] [--no-stages] [--no-cli]

Each run builds a fresh network namespace holding one veth pair ``sh0``/``sh0p``
(re-created between phases so every "first" sees a fresh device) and measures:

a. first apply: wall time of ``Reconciler.apply`` on the fresh device
   (Python import, opening the netlink socket and the one-time capability
   probe are excluded there and reported on their own lines);
b. in-sync resync: ``apply`` again on the same socket; it must make 0 changes;
c. ``tc -n NS -batch FILE`` of ``render.device_commands`` of the same plan on a
   fresh device (wall time of the child process, fork+exec included; an empty
   batch file is timed too so the exec cost can be subtracted), then checked:
   shaperd's diff of the tc-built device against the plan must be empty;
d. memory: tracemalloc peak of Python allocations during (a) and (b), in a
   separate pass on another fresh device (tracing slows Python 2-3x, so it is
   never on while timing); ru_maxrss of this process (whole-process peak RSS,
   interpreter and imports included, monotonic) and of the ``tc`` child;
e. (unless --no-cli) the one-shot CLI end to end, ``shaperd apply --netns``
   on a fresh device: interpreter start, imports, probe and apply, with its
   ru_maxrss.

Logging stays on as in production (JSON lines, one per kernel change) but
goes to /dev/null. In the last run each step of a reconcile (discover,
tenancy, and per backend plan, observe, diff, apply) is also timed on its own
with the engine's own functions (unless --no-stages). Namespaces (shaperd_bed.netns) are removed on any
exit, SIGTERM included; every child runs in its own process group with a
deadline.

Exit status: 0 when both aims hold (first apply < 250 ms, resync < 50 ms,
medians), 1 when one does not, 2 when it cannot run (not root, no tc).
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from contextlib import redirect_stderr
from shaperd_bed import netns  # noqa: E402

TENANTS = 64
PREFIXES = 500
CAPACITY = "100Gbps"
DEVICE = "sh0"

_V4_NET = ipaddress.ip_network("198.18.0.0/15")
_V6_NET = ipaddress.ip_network("2001:db8::/32")


# ------------------------------------------------------------------ inputs (pure)


def make_prefixes(n: int = PREFIXES) -> list[str]:
    """``n`` distinct source prefixes: 60 % IPv4 /24, 30 % IPv4 /32, 10 % IPv6 /64.

    /24s count up from 198.18.0.0; /32s count down from 198.19.255.255 (so
    they never fall inside one of the /24s for n <= 800); /64s are
    2001:db8:0:<i>::/64.
    """
    n24 = n * 6 // 10
    n32 = n * 3 // 10
    n64 = n - n24 - n32
    if n24 + n32 // 256 + 1 > 512 - 1:
        raise ValueError(f"{n} prefixes do not fit in 198.18.0.0/15")
    base = int(_V4_NET.network_address)
    top = int(_V4_NET.broadcast_address)
    out = [f"{ipaddress.IPv4Address(base + (i << 8))}/24" for i in range(n24)]
    out += [f"{ipaddress.IPv4Address(top - i)}/32" for i in range(n32)]
    v6 = int(_V6_NET.network_address)
    out += [f"{ipaddress.IPv6Address(v6 + (i << 64))}/64" for i in range(n64)]
    return out


def make_config_dict(tenants: int = TENANTS, prefixes: int = PREFIXES, device: str = DEVICE) -> dict:
    """A tenants file (as a dict) for ``from_dict``: varied guarantees, limits, priorities.

    Guarantees cycle 0.5/1/1.5/2 Gbps (80 Gbps in all for 64 tenants, under
    100 Gbps less the 1 % default reserve); limits cycle none/5/10/40/100 Gbps
    (never below the guarantee; 40 and 100 Gbps need the 64-bit rate
    attributes); priorities take 10 distinct values, more than HTB's 7 tenant
    levels. Prefix i goes to tenant i mod ``tenants``.
    """
    guarantees_mbps = (500, 1000, 1500, 2000)
    limits_mbps = (None, 5000, 10000, 40000, 100000)
    pfx = make_prefixes(prefixes)
    out = []
    for i in range(tenants):
        g = guarantees_mbps[i % len(guarantees_mbps)]
        lim = limits_mbps[i % len(limits_mbps)]
        t: dict = {
            "name": f"tenant-{i:02d}",
            "bandwidthGuarantee": f"{g}Mbps",
            "priority": (i * 7) % 10 * 10,
            "match": {"cidrs": pfx[i::tenants]},
        }
        if lim is not None:
            t["bandwidthLimit"] = f"{max(lim, g)}Mbps"
        out.append(t)
    return {"node": {"interfaces": [device], "capacity": CAPACITY}, "tenants": out}


# ------------------------------------------------------------------ statistics


def summary(xs: list[float]) -> dict:
    if not xs:
        return {}
    med = statistics.median(xs)
    lo, hi = min(xs), max(xs)
    return {"median": med, "min": lo, "max": hi, "spread": hi - lo,
            "spread_pct": (hi - lo) / med * 100 if med else 0.0, "n": len(xs), "samples": xs}


# ------------------------------------------------------------------ namespaces


class Bench(netns.Namespaces):
    """Namespaces this process created (``shpb-<pid>-<tag>``); all removed by ``cleanup``."""

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"shpb-{os.getpid()}-"

    def new_netns(self, tag: str) -> str:
        return self.add(f"{self.prefix}{tag}")


def fresh_veth(ns: str, name: str = DEVICE) -> int:
    """(Re)create the veth pair ``name``/``name``p in ``ns``, both up; returns ``name``'s ifindex.

    With ip(8), not a second pyroute2 socket: two IPRoute objects open at once
    in one thread can hang pyroute2 0.9's shared event loop.
    """
    netns.run(["ip", "-n", ns, "link", "del", name], check=False)  # absent on the first call
    netns.veth(name, ns, f"{name}p", ns)
    return netns.link(ns, name)["ifindex"]


CHILD_DEADLINE_S = 300.0  # a tc -batch or CLI apply takes well under a second


def run_child(argv: list[str], stdout_path: str = os.devnull) -> tuple[float, int, int, str]:
    """(wall seconds, exit code, child's ru_maxrss KiB, stderr) of one child process.

    Not netns.run: wait4() gives the child's rusage. Own process group all the same, killed as a
    group at CHILD_DEADLINE_S by a timer started before the clock so it costs the figure nothing."""
    child: dict = {}

    def expire() -> None:
        if "pid" in child and "done" not in child:
            os.killpg(child["pid"], signal.SIGKILL)

    timer = threading.Timer(CHILD_DEADLINE_S, expire)
    timer.daemon = True
    timer.start()
    try:
        with open(stdout_path, "wb") as out, tempfile.TemporaryFile() as err:
            t = time.perf_counter()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            child["pid"] = p.pid
            _, status, ru = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t
            child["done"] = True
            p.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            return wall, p.returncode, ru.ru_maxrss, err.read().decode(errors="replace")
    finally:
        child["done"] = True
        timer.cancel()


def child_maxrss_kib(argv: list[str]) -> int | None:
    """Peak RSS (KiB) of ``argv`` as GNU time(1) reports it, or None without /usr/bin/time.

    Not wait4() from here: Linux carries the RSS high-water mark of the
    forking process across exec, so any child of this ~60 MiB Python would
    report at least that. time(1) is small, so its child's figure is the
    child's own.
    """
    gnu_time = "/usr/bin/time"
    if not os.path.exists(gnu_time):
        return None
    with tempfile.NamedTemporaryFile("r") as f:
        wall, rc, _, err = run_child([gnu_time, "-f", "%M", "-o", f.name] + argv)
        if rc != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {rc}: {err.strip()[-500:]}")
        return int(f.read().strip().splitlines()[-1])


def maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ------------------------------------------------------------------ one-time costs


_IMPORTS = ("shaperd.core.config", "shaperd.engine.reconciler", "shaperd.kernel.tc", "shaperd.kernel.probe",
            "shaperd.backends.htb.backend", "shaperd.backends.marks.backend")


def time_imports(repeat: int = 5) -> dict:
    """Fresh interpreters: bare start-up, and the import of what a one-shot apply needs."""
    code = ("import time; t=time.perf_counter(); import " + ", ".join(_IMPORTS) +
            "; print(time.perf_counter()-t)")
    imports, startup = [], []
    for _ in range(repeat):
        out = netns.run([sys.executable, "-c", code])
        imports.append(float(out.stdout.strip()))
        wall, _, _, _ = run_child([sys.executable, "-c", "pass"])
        startup.append(wall)
    return {"import_s": summary(imports), "interpreter_start_s": summary(startup)}


# ------------------------------------------------------------------ stages


def _median_s(fn, repeat: int = 7) -> float:
    xs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs)


def stage_times(rec, cfg, fresh: bool) -> dict[str, float]:
    """Each step of one reconcile, timed on its own with the engine's own functions.

    fresh=True: one pass on a fresh device (the last step writes); False: medians of 7 on an in-sync device.
    """
    from shaperd.core.protocol import PlanInput
    from shaperd.kernel.rtnl import CachedReads
    from shaperd.core.tenancy import tenancy

    out: dict[str, float] = {}
    timed = (lambda f: _median_s(f, 1)) if fresh else _median_s
    out["discover (links, routes, sysfs, RDMA sysfs)"] = timed(lambda: rec.inventory(cfg))
    inv = rec.inventory(cfg)
    out["tenancy (pure)"] = timed(lambda: tenancy(cfg, inv))
    ctx = PlanInput(cfg, inv, tenancy(cfg, inv))
    for b in rec.enabled:
        out[f"{b.name}: plan (pure)"] = timed(lambda: b.plan(ctx))
        desired = b.plan(ctx)
        out[f"{b.name}: observe (kernel reads)"] = timed(lambda: b.observe(CachedReads(rec.reader), inv))
        observed = b.observe(CachedReads(rec.reader), inv)
        out[f"{b.name}: diff (pure)"] = timed(lambda: b.diff(desired, observed))
        if fresh:
            diffs = b.diff(desired, observed)
            t = time.perf_counter()
            for d in diffs:
                if d.ops:
                    res = b.apply(d)
                    if res.batch_failed or res.failed:
                        raise RuntimeError(f"{b.name}: apply failed on {d.target}")
            out[f"{b.name}: apply (encode + one netlink batch)"] = time.perf_counter() - t
    return out


def tc_vs_plan(ops) -> dict[str, int]:
    """What shaperd would still change on a device tc -batch built: counts by operation class."""
    out: dict[str, int] = {}
    for op in ops:
        out[type(op).__name__] = out.get(type(op).__name__, 0) + 1
    return out


def one_run(bench: Bench, i: int, cfg, cfg_file: str, batch_file: str, empty_file: str, caps, sysfs: str,
            expected_changes: int, cli: bool, stages: bool = False) -> dict:
    from shaperd.backends.htb import observe as htb_observe
    from shaperd.backends.htb.diff import diff_device
    from shaperd.engine.reconciler import Reconciler, default_backends
    from shaperd.kernel import tc
    from shaperd.engine.probe import probe_capabilities
    from shaperd.kernel.rtnl import RtnlReader
    from shaperd.core.roots import Roots

    roots = Roots.of(sys=sysfs)

    def reconciler(ipr, reader):
        return Reconciler(reader, default_backends(ipr), caps, roots=roots)

    r: dict = {}
    t = time.perf_counter()
    probe_capabilities()
    r["probe_s"] = time.perf_counter() - t

    ns = bench.new_netns(str(i))
    try:
        # (a)+(b) timed, no tracing.
        fresh_veth(ns)
        t = time.perf_counter()
        ipr = tc.open_writer(ns)
        reader = RtnlReader(ns)
        r["open_netlink_s"] = time.perf_counter() - t
        try:
            rec = reconciler(ipr, reader)
            gc.collect()
            t = time.perf_counter()
            rep = rec.apply(cfg)
            r["first_apply_s"] = time.perf_counter() - t
            r["first_apply_internal_s"] = rep.duration_s
            r["first_apply_changes"] = rep.changes
            if not rep.ok or rep.changes != expected_changes:
                raise RuntimeError(f"first apply: ok={rep.ok} changes={rep.changes} (want {expected_changes})")
            r["maxrss_after_first_apply_kib"] = maxrss_kib()
            t = time.perf_counter()
            rep = rec.apply(cfg)
            r["resync_s"] = time.perf_counter() - t
            r["resync_changes"] = rep.changes
            if not rep.ok or rep.changes != 0:
                raise RuntimeError(f"in-sync resync made {rep.changes} changes (ok={rep.ok}); expected 0")

            # (d) tracemalloc pass on a fresh device.
            fresh_veth(ns)
            rec = reconciler(ipr, reader)
            gc.collect()
            tracemalloc.start()
            rep = rec.apply(cfg)
            r["first_apply_tracemalloc_peak_b"] = tracemalloc.get_traced_memory()[1]
            assert rep.changes == expected_changes
            tracemalloc.reset_peak()
            rep = rec.apply(cfg)
            r["resync_tracemalloc_peak_b"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert rep.changes == 0

            # (c) tc -batch of the same objects on a fresh device.
            ifindex = fresh_veth(ns)
            wall, rc, rss, err = run_child(["tc", "-n", ns, "-batch", empty_file])
            r["tc_exec_empty_s"] = wall
            wall, rc, rss, err = run_child(["tc", "-n", ns, "-batch", batch_file])
            if rc != 0:
                raise RuntimeError(f"tc -batch failed ({rc}): {err.strip()[:500]}")
            r["tc_batch_s"] = wall
            dp = rec.plan(cfg).desired["htb"].device(DEVICE)
            observed = htb_observe.device_state(reader, DEVICE, ifindex)
            r["tc_batch_objects"] = {"classes": len(observed.classes), "leaves": len(observed.leaves),
                                     "filters": len(observed.filters)}
            r["tc_batch_vs_plan"] = tc_vs_plan(diff_device(dp, observed).ops)
            # tc's own peak RSS, on one more fresh device.
            fresh_veth(ns)
            rss = child_maxrss_kib(["tc", "-n", ns, "-batch", batch_file])
            if rss is not None:
                r["tc_batch_maxrss_kib"] = rss
            if stages:
                fresh_veth(ns)
                r["stages_first"] = stage_times(reconciler(ipr, reader), cfg, fresh=True)
                r["stages_resync"] = stage_times(reconciler(ipr, reader), cfg, fresh=False)
        finally:
            ipr.close()
            reader.close()

        # (e) the one-shot CLI, end to end.
        if cli:
            fresh_veth(ns)
            shaperd_bin = os.path.join(os.path.dirname(sys.executable), "shaperd")
            argv = ([shaperd_bin] if os.path.exists(shaperd_bin) else [sys.executable, "-m", "shaperd.cli.main"])
            argv += ["--log-json", "apply", "--netns", ns, "--config", cfg_file, "--sysfs-root", sysfs]
            wall, rc, _, err = run_child(argv)
            if rc != 0:
                raise RuntimeError(f"shaperd apply exited {rc}: {err.strip()[-500:]}")
            r["cli_apply_s"] = wall
            fresh_veth(ns)
            rss = child_maxrss_kib(argv)
            if rss is not None:
                r["cli_apply_maxrss_kib"] = rss
    finally:
        bench.remove(ns)
    return r


# ------------------------------------------------------------------ report


def fmt_ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def markdown(res: dict) -> str:
    s = res["summary"]
    rows = [
        ("first apply (`Reconciler.apply`, fresh device)", "first_apply_s", "ms"),
        ("in-sync resync (0 changes)", "resync_s", "ms"),
        ("`tc -batch` of the same objects (fork+exec incl.)", "tc_batch_s", "ms"),
        ("`tc -batch` of an empty file (exec cost)", "tc_exec_empty_s", "ms"),
        ("capability probe (once at start)", "probe_s", "ms"),
        ("open netlink socket in netns", "open_netlink_s", "ms"),
        ("`shaperd apply` CLI end to end (start, import, probe, apply)", "cli_apply_s", "ms"),
    ]
    mem_rows = [
        ("tracemalloc peak, first apply", "first_apply_tracemalloc_peak_b", "MiB", 1 / 2**20),
        ("tracemalloc peak, resync", "resync_tracemalloc_peak_b", "MiB", 1 / 2**20),
        ("ru_maxrss, `shaperd apply` CLI process", "cli_apply_maxrss_kib", "MiB", 1 / 1024),
        ("ru_maxrss, `tc -batch` process", "tc_batch_maxrss_kib", "MiB", 1 / 1024),
    ]
    env = res["env"]
    out = [
        f"Scenario: {res['scenario']['tenants']} tenants, {res['scenario']['prefixes']} source prefixes "
        f"({res['scenario']['prefix_mix']}), one veth with node.capacity {CAPACITY}: "
        f"{res['scenario']['objects']} kernel objects. {res['runs']} runs, "
        f"shaperd {'with' if res['capabilities']['bpf'] else 'without'} cls_bpf "
        f"(leaves {', '.join(res['capabilities']['leaf_kinds'])}). "
        f"`{res['command']}`; {env['kernel']}, {env['cpus']} CPUs, Python {env['python']}, "
        f"pyroute2 {env['pyroute2']}, {env['tc']}.",
        "",
        "| measurement | median | min | max | spread (max-min) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, key, unit in rows:
        if key in s:
            v = s[key]
            out.append(f"| {label} | {fmt_ms(v['median'])} {unit} | {fmt_ms(v['min'])} | {fmt_ms(v['max'])} | "
                       f"{fmt_ms(v['spread'])} ({v['spread_pct']:.0f} %) |")
    for label, key, unit, k in mem_rows:
        if key in s:
            v = s[key]
            out.append(f"| {label} | {v['median'] * k:.2f} {unit} | {v['min'] * k:.2f} | {v['max'] * k:.2f} | "
                       f"{v['spread'] * k:.2f} |")
    imp = res["one_time"]
    out.append(f"| import of shaperd + pyroute2 (fresh interpreter) | {fmt_ms(imp['import_s']['median'])} ms | "
               f"{fmt_ms(imp['import_s']['min'])} | {fmt_ms(imp['import_s']['max'])} | "
               f"{fmt_ms(imp['import_s']['spread'])} |")
    out.append(f"| ru_maxrss of the benchmark process after imports+probe / at end | "
               f"{res['maxrss_kib']['after_setup'] / 1024:.1f} / {res['maxrss_kib']['end'] / 1024:.1f} MiB | | | |")
    r = res["ratios"]
    out += [
        "",
        f"First apply is {r['first_vs_tc']:.1f}x `tc -batch` ({r['first_vs_tc_net']:.1f}x with tc's exec cost "
        f"subtracted); the in-sync resync is {r['resync_vs_tc']:.1f}x `tc -batch` and sends no write. "
        f"Targets: first apply < 250 ms ({'met' if r['first_ok'] else 'NOT met'}), "
        f"resync < 50 ms ({'met' if r['resync_ok'] else 'NOT met'}).",
    ]
    return "\n".join(out)


def print_stages(run: dict) -> None:
    for key, title in (("stages_first", "first apply on a fresh device, one pass"),
                       ("stages_resync", "in-sync resync, median of 7 calls each")):
        print(f"\n## stages: {title}")
        for k, v in run[key].items():
            print(f"  {k:<50} {fmt_ms(v):>7} ms")


# ------------------------------------------------------------------ main


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ itself, also when loaded by path
from _signals import sigterm_as_exit  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="measured runs (default 10)")
    ap.add_argument("--json", action="store_true", help="print one JSON document (raw samples included)")
    ap.add_argument("--tenants", type=int, default=TENANTS)
    ap.add_argument("--prefixes", type=int, default=PREFIXES)
    ap.add_argument("--no-stages", dest="stages", action="store_false", help="skip the per-stage timing pass")
    ap.add_argument("--no-cli", dest="cli", action="store_false", help="skip the end-to-end CLI measurement")
    ap.add_argument("--no-bpf", dest="bpf", action="store_false",
                    help="plan as on a kernel without cls_bpf: then shaperd builds exactly what tc -batch builds")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("apply_perf: needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    if not shutil.which("tc"):
        print("apply_perf: tc (iproute2) not found", file=sys.stderr)
        return 2

    one_time = time_imports()
    t = time.perf_counter()
    import pyroute2
    import yaml

    from shaperd.core import config as config_mod
    from shaperd.core import log
    from shaperd.backends.htb.render import device_commands
    from shaperd.engine.reconciler import Reconciler, default_backends
    from shaperd.engine.probe import probe_capabilities
    from shaperd.kernel.rtnl import RtnlReader
    from shaperd.core.roots import Roots

    one_time["import_in_process_s"] = time.perf_counter() - t

    # Production logging (JSON lines), into /dev/null.
    devnull = open(os.devnull, "w")
    with redirect_stderr(devnull):
        log.configure(json=True, level="info")

    t = time.perf_counter()
    caps = probe_capabilities()
    one_time["first_probe_s"] = time.perf_counter() - t
    if not args.bpf:
        import dataclasses

        caps = dataclasses.replace(caps, bpf=False, bpf_maps=False)

    doc = make_config_dict(args.tenants, args.prefixes)
    cfg = config_mod.from_dict(doc)
    work = tempfile.mkdtemp(prefix="shaperd-bench-")
    sysfs = os.path.join(work, "sys")  # empty: veths report no speed anyway; node.capacity is set
    os.makedirs(sysfs)
    cfg_file = os.path.join(work, "tenants.yaml")
    with open(cfg_file, "w") as f:
        yaml.safe_dump(doc, f)
    batch_file = os.path.join(work, "tc.batch")
    empty_file = os.path.join(work, "empty.batch")
    open(empty_file, "w").close()

    bench = Bench()
    runs: list[dict] = []
    try:
        with sigterm_as_exit():
            # The plan (and so the tc commands) on a scratch device of the same name.
            ns = bench.new_netns("plan")
            from shaperd.kernel import tc

            fresh_veth(ns)
            with tc.open_writer(ns) as ipr, RtnlReader(ns) as reader:
                rec = Reconciler(reader, default_backends(ipr), caps, roots=Roots.of(sys=sysfs))
                dp = rec.plan(cfg).desired["htb"].device(DEVICE)
            bench.remove(ns)
            if dp is None:
                raise RuntimeError("the benchmark config does not plan for the device")
            cmds = device_commands(dp)
            with open(batch_file, "w") as f:
                f.writelines(" ".join(c) + "\n" for c in cmds)
            # root qdisc + classes + leaves + filters
            expected = 1 + len(dp.classes) + len(dp.leaves) + len(dp.filters)
            expected += 1 if getattr(dp, "map_classifier", None) is not None else 0  # the eBPF classifier attach
            maxrss_setup = maxrss_kib()
            # Warm-up run (not counted): page cache, kernel module autoload, lazy imports.
            one_run(bench, 0, cfg, cfg_file, batch_file, empty_file, caps, sysfs, expected, cli=False)
            for i in range(1, args.runs + 1):
                runs.append(one_run(bench, i, cfg, cfg_file, batch_file, empty_file, caps, sysfs, expected, args.cli,
                                    stages=args.stages and i == args.runs))
                if not args.json:
                    r = runs[-1]
                    print(f"run {i:>2}: first {fmt_ms(r['first_apply_s'])} ms, resync {fmt_ms(r['resync_s'])} ms, "
                          f"tc -batch {fmt_ms(r['tc_batch_s'])} ms"
                          + (f", cli {fmt_ms(r['cli_apply_s'])} ms" if "cli_apply_s" in r else ""), flush=True)
    finally:
        bench.cleanup()
        shutil.rmtree(work, ignore_errors=True)

    keys = [k for k in runs[0] if isinstance(runs[0][k], (int, float)) and not k.endswith("changes")]
    s = {k: summary([r[k] for r in runs]) for k in keys}
    tc_net = max(s["tc_batch_s"]["median"] - s["tc_exec_empty_s"]["median"], 1e-9)
    n24 = sum(1 for p in make_prefixes(args.prefixes) if p.endswith("/24"))
    n32 = sum(1 for p in make_prefixes(args.prefixes) if p.endswith("/32"))
    tc_version = netns.run(["tc", "-V"], check=False).stdout.strip()
    res = {
        "command": "sudo " + " ".join([sys.executable, "bench/apply_perf.py"] + (argv if argv is not None else sys.argv[1:])),
        "runs": args.runs,
        "env": {"kernel": f"Linux {platform.release()}", "cpus": os.cpu_count(), "python": platform.python_version(),
                "pyroute2": getattr(pyroute2, "__version__", "?"), "tc": tc_version.replace("tc utility, ", "")},
        "scenario": {"tenants": args.tenants, "prefixes": args.prefixes,
                     "prefix_mix": f"{n24} IPv4 /24, {n32} IPv4 /32, {args.prefixes - n24 - n32} IPv6 /64",
                     "objects": expected, "tc_commands": len(cmds)},
        "capabilities": {"bpf": caps.bpf, "leaf_kinds": sorted(caps.leaf_kinds)},
        "one_time": one_time,
        "maxrss_kib": {"after_setup": maxrss_setup, "end": maxrss_kib()},
        "summary": s,
        "tc_batch_vs_plan": runs[0]["tc_batch_vs_plan"],
        "tc_batch_objects": runs[0]["tc_batch_objects"],
        "ratios": {
            "first_vs_tc": s["first_apply_s"]["median"] / s["tc_batch_s"]["median"],
            "first_vs_tc_net": s["first_apply_s"]["median"] / tc_net,
            "resync_vs_tc": s["resync_s"]["median"] / s["tc_batch_s"]["median"],
            "first_ok": s["first_apply_s"]["median"] < 0.250,
            "resync_ok": s["resync_s"]["median"] < 0.050,
        },
        "runs_raw": runs,
    }
    if args.json:
        print(json.dumps(res, indent=2, default=str))
    else:
        print()
        print(markdown(res))
        other = [k for r in runs for k in r["tc_batch_vs_plan"] if k.startswith("OTHER")]
        print(f"\nCheck: tc -batch built {runs[0]['tc_batch_objects']}; shaperd's diff of that device against its "
              f"plan: {runs[0]['tc_batch_vs_plan'] or 'empty'}" + (f"\nWARNING: {other[:5]}" if other else ""))
        if "stages_first" in runs[-1]:
            print_stages(runs[-1])
    bad = not (res["ratios"]["first_ok"] and res["ratios"]["resync_ok"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
