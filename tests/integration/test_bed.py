"""The isolation bed on the real kernel: build/teardown, wiring, one short run.

Needs root (namespaces, veth, tc), iproute2, iperf3 and ping; skipped otherwise,
with the missing one named. shaperd's CLI is not a prerequisite: when it fails,
the run with shaperd fails. No test here asserts a throughput: shaping is
checked by what the kernel counted against the limits (tests/integration/counted.py),
and rates are the benchmarks' (bench/isolation.py).
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shaperd_bed import scenarios as sc
from shaperd_bed import shaping
from shaperd_bed.parse import IperfResult, RttStats, Sample
from shaperd_bed.topology import Bed, BedConfig, list_netns
from shaperd_bed.traffic import FloodResult, RttProbe, TcpLoad, UdpFlood, measure

from . import counted

_missing = shaping.prerequisites() if hasattr(os, "geteuid") else ["not POSIX"]
pytestmark = [pytest.mark.root,
              pytest.mark.skipif(bool(_missing), reason="; ".join(_missing) or "ok")]

REPO = Path(__file__).resolve().parents[2]


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of ours is dead for this purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _assert_gone(bed: Bed, pids=()):
    left = bed.leftovers()
    assert left == {"netns": [], "interfaces": [], "processes": [], "workdir": []}, left
    assert not [n for n in list_netns() if bed.run_id in n]
    assert bed.run_id not in _root_links()
    for pid in pids:
        assert not _alive(pid), f"process {pid} survived teardown"


@pytest.fixture(scope="module")
def bed():
    with Bed(BedConfig(link_mbit=1000)) as b:
        yield b
    _assert_gone(b)


# ------------------------------------------------------------ build/teardown
def test_build_and_teardown_leave_nothing_behind():
    before_links = _root_links()
    b = Bed(BedConfig(link_mbit=500))
    with b:
        assert set(b.namespaces()) <= set(list_netns())
        srv = b.procs.spawn(["iperf3", "-s", "-p", "5999"], b.ns["recv"])
        ping = b.procs.spawn(["ping", "-i", "0.2", b.recv_addr], b.pod_ns("a"))
        time.sleep(0.3)
        assert _alive(srv.pid) and _alive(ping.pid)
        # nothing of the bed in the root namespace, ever
        assert b.run_id not in _root_links()
        # and a stray process started behind the registry's back is also killed
        stray = subprocess.Popen(["ip", "netns", "exec", b.ns["wire"], "sleep", "60"])
    stray.wait(timeout=5)
    _assert_gone(b, [srv.pid, ping.pid])
    assert _root_links() == before_links


def test_teardown_on_exception_and_idempotent():
    b = Bed()
    with pytest.raises(ZeroDivisionError):
        with b:
            srv = b.procs.spawn(["iperf3", "-s", "-p", "5999"], b.ns["recv"])
            1 / 0
    _assert_gone(b, [srv.pid])
    b.teardown()  # twice is fine


_CHILD = r"""
import time
from shaperd_bed import Bed
with Bed() as b:
    p = b.procs.spawn(["iperf3", "-s", "-p", "5999"], b.ns["recv"])
    print(b.run_id, p.pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_tears_the_bed_down(sig):
    child = subprocess.Popen([sys.executable, "-c", _CHILD],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert line, child.stderr.read()
        run_id, pid = line[0], int(line[1])
        assert any(run_id in n for n in list_netns())
        child.send_signal(sig)
        child.wait(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert not [n for n in list_netns() if run_id in n]
    assert run_id not in _root_links()
    time.sleep(0.2)
    assert not _alive(pid)
    assert not os.path.exists(f"/tmp/shaperd-bed-{run_id}")


# ------------------------------------------------------------------ wiring
def test_topology_wiring(bed):
    for t in bed.config.tenants:
        addrs = bed.exec(f"pod-{t.short}", ["ip", "-o", "-4", "addr", "show", "dev", bed.pod_if[t.short]]).stdout
        assert f"{t.pod_addr}/24" in addrs
        route = bed.exec(f"pod-{t.short}", ["ip", "route", "get", bed.recv_addr]).stdout
        assert f"via {t.gw_addr}" in route
        # from the node, the receiver is out of the uplink (the shaped device)
    assert f"dev {bed.uplink}" in bed.exec("node", ["ip", "route", "get", bed.recv_addr]).stdout
    assert bed.exec("node", ["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip() == "1"
    tbf = bed.exec("wire", ["tc", "qdisc", "show", "dev", bed.wire_out]).stdout
    assert "tbf" in tbf and "rate 1Gbit" in tbf
    # the uplink starts bare (kernel default)
    assert "htb" not in bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout
    # every address is in 198.18.0.0/15
    for ns in bed.namespaces():
        for line in bed.exec_ns(ns, ["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
            addr = line.split()[3]
            assert addr.startswith("127.") or addr.startswith("198.18.") or addr.startswith("198.19."), addr
        assert "inet6" not in bed.exec_ns(ns, ["ip", "-o", "addr", "show"]).stdout


def test_traffic_comes_from_the_tenant_pods(bed):
    r = measure(bed, [TcpLoad("a", 2, 1.0, interval=0.5), TcpLoad("b", 3, 1.0, interval=0.5),
                      RttProbe("b", 0.5, every=0.1)], name="wiring")
    assert r["a"].streams == 2 and r["b"].streams == 3
    assert r["a"].received_bps > 0 and r["b"].received_bps > 0  # both got through; how fast is a benchmark's
    assert r["b-ping"].received >= 3
    # the servers saw the pods' addresses
    import glob
    import json
    for k, t in (("a", bed.tenant("a")), ("b", bed.tenant("b"))):
        path = glob.glob(os.path.join(bed.workdir, f"*-wiring/{k}.server.json"))[0]
        doc = json.load(open(path))
        assert {c["remote_host"] for c in doc["start"]["connected"]} == {t.pod_addr}
    assert not bed.procs.live()


def test_scheduled_zerocopy_senders_still_carry_traffic(monkeypatch):
    """A bed told how to schedule its traffic starts every process under nice (senders also pinned, TCP
    senders with iperf3 -Z) and the traffic still gets through; how much faster that is, is the benchmark's."""
    with Bed(BedConfig(link_mbit=1000, traffic_nice=5, sender_cpus=(0,), sender_zerocopy=True)) as b:
        started = []
        real = b.procs.spawn

        def spawn(argv, netns=None, **kw):
            started.append(list(argv))
            return real(argv, netns, **kw)

        monkeypatch.setattr(b.procs, "spawn", spawn)
        r = measure(b, [TcpLoad("a", 2, 1.0, interval=0.5)], name="sched")
        assert r["a"].received_bps > 0
        client = next(a for a in started if "-c" in a)
        server = next(a for a in started if "-s" in a)
        assert client[:6] == ["nice", "-n", "5", "taskset", "-c", "0"] and "-Z" in client
        assert server[:3] == ["nice", "-n", "5"] and "taskset" not in server and "-Z" not in server
    _assert_gone(b)


def test_hand_tc_classifies_each_tenant(bed):
    shaping.program_hand_tc(bed)
    try:
        r = measure(bed, [TcpLoad("a", 1, 1.0, interval=0.5), TcpLoad("b", 1, 1.0, interval=0.5)], name="cls")
        classes = shaping.uplink_state(bed)["class"]
        # Every byte the receiver got from a tenant went through that tenant's class (which counts whole
        # frames, so more than the payload); however fast the machine managed to send it.
        for classid, k in (("1:10", "a"), ("1:20", "b")):
            payload = r[k].received_bps * r[k].duration / 8
            assert payload > 0 and classes[classid]["bytes"] >= 0.99 * payload, (classid, classes[classid], payload)
        assert classes["1:30"]["bytes"] < 1_000_000   # default: only stray packets
    finally:
        shaping.unprogram_hand_tc(bed)
    assert "htb" not in bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout


def test_udp_flood_is_held_to_the_wire_rate(bed):
    """The wire's TBF (the emulated NIC) sent no more than its rate allows, as the kernel counted it; if the
    flood offered more than that (a busy machine may not), the TBF dropped the rest. How fast the flood
    went is measured by the benchmarks (bench/isolation.py), not asserted here."""
    w0 = counted.tbf_root(bed.ns["wire"], bed.wire_out)
    r = measure(bed, [UdpFlood("b", 2e9, 1.0)], name="flood")
    w1 = counted.tbf_root(bed.ns["wire"], bed.wire_out)
    f = r["b-udp"]
    assert f.received_bps > 0
    assert w1.counters["root"].rate_Bps == bed.link_bps / 8
    assert counted.over_limit(w0, w1) == {}
    offered = f.sent_bps * 1.0 / 8  # payload bytes the flood sent in its 1 s
    if offered > counted.allowed(w0, w1, "root") + bed.config.tbf_limit():
        assert w1.counters["root"].drops > w0.counters["root"].drops, (offered, w0, w1)


# ---------------------------------------------- each scenario's wiring (stubbed)
class _Recorder:
    def __init__(self, bed):
        self.bed = bed
        self.calls = []
        self.configs = []

    def measure(self, bed, loads, name="m", slack=20.0):
        uplink = bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout
        self.calls.append((name, loads, uplink))
        out = {}
        for ld in loads:
            s = [Sample(i * 0.1, (i + 1) * 0.1, 100e6) for i in range(int(getattr(ld, "duration", 1) * 10))]
            if isinstance(ld, TcpLoad):
                out[ld.key] = IperfResult("TCP", ld.streams, ld.duration, 100e6, 100e6, 0, None, 1448, s, s)
            elif isinstance(ld, UdpFlood):
                out[ld.key] = FloodResult(ld.rate_bps, 100e6, s)
            else:
                out[ld.key] = RttStats(10, 10, [0.1] * 10)
        return out

    def program(self, bed, cfg):
        self.configs.append(cfg)
        shaping.program_hand_tc(bed)  # stands in for shaperd: something must be on the uplink

    def unprogram(self, bed):
        bed.clear_node_shaping()


def test_every_scenario_is_wired_right(bed, monkeypatch):
    rec = _Recorder(bed)
    monkeypatch.setattr(sc, "measure", rec.measure)
    shaper = sc.Shaper(program_node=rec.program, unprogram_node=rec.unprogram)
    s = sc.Settings(duration=2.0)
    results = sc.run_all(bed, s, shaper=shaper, keep_going=False)
    assert {r.key for r in results} == {f"{x}/{m}" for x in sc.SCENARIOS for m in sc.MODES}
    by_name = {name: (loads, uplink) for name, loads, uplink in rec.calls}

    def loads(name):
        return {ld.key: ld for ld in by_name[name][0]}

    # mode reached the node: bare for none, HTB for the shaped modes
    for name, (_, uplink) in by_name.items():
        if name.endswith("-none") or name == "idle-rtt":
            assert "htb" not in uplink, name
        else:
            assert "htb" in uplink, name
    # 1: each alone, one tenant per measurement
    assert set(loads("alone-a-none")) == {"a"} and set(loads("alone-b-none")) == {"b"}
    # 2/3: B uses 8x A's flows
    tl = loads("together-none")
    assert tl["b"].streams == 8 * tl["a"].streams
    assert loads("together-shaperd")["b"].streams == 8 * loads("together-shaperd")["a"].streams
    # 4: A floods with many flows, B few
    pl = loads("pressure-shaperd")
    assert pl["a"].streams > pl["b"].streams
    # 5: UDP flood at 2x the link from A, TCP from B
    ul = loads("udp-hand-tc")
    assert isinstance(ul["a-udp"], UdpFlood) and ul["a-udp"].rate_bps == 2 * bed.link_bps
    assert isinstance(ul["b"], TcpLoad)
    # 6: B starts after A, fine-grained samples
    cl = loads("converge-shaperd")
    assert cl["b"].start == s.converge_lead and cl["a"].start == 0 and cl["b"].interval <= 0.1
    # 7: ping from B while A saturates; idle reference taken once
    ll = loads("latency-shaperd")
    assert isinstance(ll["b-ping"], RttProbe) and ll["b-ping"].tenant == "b"
    assert sum(1 for n in by_name if n == "idle-rtt") == 1
    # shaperd configs: normal limits for together/latency, raised for pressure/udp/converge
    lims = [{t["name"]: t["bandwidthLimit"] for t in c["tenants"]} for c in rec.configs]
    assert {"tenant-a": "600Mbps", "tenant-b": "400Mbps"} in lims
    assert {"tenant-a": "1Gbps", "tenant-b": "1Gbps"} in lims
    for c in rec.configs:
        assert c["node"]["interfaces"] == [bed.uplink]
        assert [t["match"]["cidrs"] for t in c["tenants"]] == [["198.18.1.0/24"], ["198.18.2.0/24"]]
    assert "htb" not in bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout


# ------------------------------------------------------------ a real run
def _counted_measurements(monkeypatch, bed) -> list[tuple[counted.Reading, counted.Reading]]:
    """Read the uplink's HTB classes (through netlink) right before and after each of a scenario's measurements."""
    readings = []
    real = sc.measure

    def measure_counted(b, loads, **kw):
        before = counted.htb_classes(bed.ns["node"], bed.uplink)
        try:
            return real(b, loads, **kw)
        finally:
            readings.append((before, counted.htb_classes(bed.ns["node"], bed.uplink)))

    monkeypatch.setattr(sc, "measure", measure_counted)
    return readings


def _held_to_their_ceilings(readings, res) -> None:
    ((before, after),) = readings
    assert before.counters, "nothing shaped the uplink during the measurement"
    assert counted.over_limit(before, after) == {}  # no class sent more than its ceil allows, at any load
    for k in ("a", "b"):  # both tenants got through (how much of their guarantee: bench/isolation.py)
        assert res.tenants[k].goodput_bps > 0, k


def test_short_scenario_hand_tc_holds_every_class_to_its_ceil(bed, monkeypatch):
    """The pressure scenario under hand-written tc: A floods with 16 flows against B's 2. That B keeps its
    guarantee is a rate, measured by the benchmark (bench/isolation.py, BENCHMARKS.md); here the kernel's
    counters show that every class stayed within its ceil while both tenants' traffic went through."""
    readings = _counted_measurements(monkeypatch, bed)
    res = sc.run_pressure(bed, "hand-tc", sc.Settings(duration=2.0), sc.Shaper())
    _held_to_their_ceilings(readings, res)
    assert "htb" not in bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout


def test_short_scenario_with_shaperd(bed, monkeypatch):
    """shaperd's own CLI programs the node (apply, then teardown): a CLI that fails fails this test. The
    tenants' limits (60 % and 40 % of the link) held, as the kernel counted, whatever the machine's load."""
    readings = _counted_measurements(monkeypatch, bed)
    res = sc.run_together(bed, "shaperd", sc.Settings(duration=2.0), sc.Shaper())
    _held_to_their_ceilings(readings, res)
    ((_, after),) = readings
    ceils = sorted(c.rate_Bps * 8 for c in after.counters.values())
    for t in bed.config.tenants:  # shaperd's tenant classes carry each tenant's limit
        assert round(t.limit * bed.link_bps) in ceils, (t.short, ceils)
    assert "htb" not in bed.exec("node", ["tc", "qdisc", "show", "dev", bed.uplink]).stdout


# ------------------------------------------------------------------ demo
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_demo_interrupted_leaves_nothing(sig):
    import re

    p = subprocess.Popen([sys.executable, "-m", "shaperd_bed.demo", "--duration", "3", "--scenarios", "together",
                          "--modes", "none"], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        run_id = None
        for _ in range(20):
            line = p.stderr.readline()
            m = re.search(r"bed (\w+) built", line)
            if m:
                run_id = m.group(1)
                break
        assert run_id, "demo did not report its bed"
        time.sleep(1.0)  # inside the first measurement: iperf3 running
        pids = []
        for ns in [n for n in list_netns() if run_id in n]:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
            pids += [int(x) for x in out.split()]
        assert pids, "no traffic process running in the demo's namespaces"
        p.send_signal(sig)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc in (130, 128 + sig)
    assert not [n for n in list_netns() if run_id in n]
    assert run_id not in _root_links()
    assert not os.path.exists(f"/tmp/shaperd-bed-{run_id}")
    for pid in pids:
        assert not _alive(pid), f"process {pid} of the demo survived"


@pytest.mark.slow  # 8-35 s (--durations, quiet)
def test_demo_json_short_run():
    import json

    p = subprocess.run([sys.executable, "-m", "shaperd_bed.demo", "--duration", "1.5", "--scenarios", "alone,latency",
                        "--modes", "none,hand-tc", "--json", "--quiet"], cwd=str(REPO), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {r["scenario"] + "/" + r["mode"] for r in doc["results"]} >= {"alone/none", "latency/hand-tc"}
    assert not [n for n in list_netns() if doc["run_id"] in n]


def test_extra_pods_inbound_link_and_reverse_load():
    """``extra_pods``: pod namespaces beside the tenants' that are no tenant; ``inbound_link``: the wire's TBF
    towards the node too; ``TcpLoad(reverse=True)``: recv sends, the pod receives (bench/pod_caps.py's ingress)."""
    import json

    from shaperd_bed.topology import TenantSpec

    extra = TenantSpec("x", "x", 9, 0.0, 0.0, 0, 5209)
    with Bed(BedConfig(link_mbit=1000, extra_pods=(extra,), inbound_link=True)) as b:
        assert [t.short for t in b.config.tenants] == ["a", "b"] and b.tenant("x") == extra
        tbf = b.exec("wire", ["tc", "qdisc", "show", "dev", b.wire_in]).stdout
        assert "tbf" in tbf and "rate 1Gbit" in tbf

        def inbound_bytes() -> int:
            qs = json.loads(b.exec("wire", ["tc", "-s", "-j", "qdisc", "show", "dev", b.wire_in]).stdout)
            return sum(q["bytes"] for q in qs if q.get("root"))

        before = inbound_bytes()
        r = measure(b, [TcpLoad("x", 2, 1.0, interval=0.5, reverse=True)], name="reverse")
        assert r["x"].received_bps > 0
        # what the pod received crossed the wire towards the node (as many bytes at least)
        assert inbound_bytes() - before >= r["x"].received_bps * r["x"].duration / 8
    _assert_gone(b)
