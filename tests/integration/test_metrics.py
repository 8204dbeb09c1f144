"""Issue 5 end to end: a real `shaperd run` in a namespace bed, real traffic, real scrapes.

The metrics port lives inside the node namespace, so every scrape runs there
(``ip netns exec NODE python -c urllib...``).

Starving a tenant on purpose: HTB always serves a class below its rate
before anyone borrows, so on a device that accepts every packet no tenant
can be backlogged and under its guarantee. It happens when the device
drains slower than ``node.capacity`` says (a NIC that negotiated a lower
speed, pause frames from a congested switch). The bed emulates exactly that:
an XDP program on the peer veth that burns CPU per packet, run in a threaded
NAPI poll, makes the uplink drain far below 1 Gbit/s, and veth's qdisc
backpressure (Linux 6.15+) keeps the backlog in shaperd's HTB class. The
tenant has demand (its queue stays full) and gets less than its guarantee:
the below-guarantee counter must rise. Pressing on its *limit* (a queue and
drops, but sending at a limit above the guarantee) must not count.

The daemon samples every 0.5 s. The tests never sleep for it: they wait
until a scrape shows what they need (a counter reaching a value, N more
samples, a queue drained), with a deadline that only bounds a failure.
Floods run until the test has seen enough and are then stopped; the exact
magnitudes for fixed durations are unit-tested on an injected clock
(tests/unit/test_sampler.py). Every process runs in its own process group
and is stopped by group id however the test ends.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shaperd.backends.common.objects import ROOT_HANDLE
from shaperd.core.ids import assign_minors
from tests import procs

from . import counted
from .conftest import PY, SENDER, needs_root, wait_for

pytestmark = needs_root

PORT = 9567
DEADLINE = 30.0  # seconds; bounds a failure only
FLOOD_CAP_S = "120"  # a flood stops by itself after this, should the test's stop never come
# veth pushes back on its qdisc from this kernel on; before it no HTB backlog can build on the bed
VETH_BACKPRESSURE = (6, 15)
CONFIG = """
node:
  interfaces: [up0]
  capacity: 1Gbps
tenants:
  - name: alpha
    bandwidthGuarantee: 400Mbps
    priority: 10
    match: {cidrs: [198.18.1.0/24]}
  - name: beta
    bandwidthGuarantee: 100Mbps
    bandwidthLimit: 500Mbps
    priority: 5
    match: {cidrs: [198.18.2.0/24]}
  - name: capped
    bandwidthGuarantee: 10Mbps
    bandwidthLimit: 20Mbps
    priority: 5
    match: {cidrs: [198.18.3.0/24]}
"""
# capped's limit is far below what one flooding core sends even while the machine is busy (a busy
# 2-core run reached 80 Mbit/s): the flood presses on it whatever the load, and the kernel's drop and
# overlimit counters say that it did.
# What one UDP datagram costs HTB on an Ethernet veth: payload + UDP 8 + IPv4 20 + Ethernet 14.
OVERHEAD = 8 + 20 + 14

SCRAPE = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=20)
    print(r.status); sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); sys.stdout.write(e.read().decode())
"""

FLOOD = r"""
import socket, sys, time
src, dst, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 16 << 20)  # SO_SNDBUFFORCE: keep the class queue full
s.bind((src, 0))
try:
    s.setsockopt(17, 103, 1400)  # UDP_SEGMENT
    buf = bytes(1400 * 40)
except OSError:
    buf = bytes(1400)
s.connect((dst, 9))
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        s.send(buf)
    except OSError:
        time.sleep(0.0005)
"""

# Load an XDP program that spins ~K iterations per packet, attach it to a device.
BURNER = r"""
import ctypes, os, platform, struct, sys
from pyroute2 import IPRoute
dev, k = sys.argv[1], int(sys.argv[2])
def insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)
prog = (insn(0xb7, 1) + insn(0x07, 1, imm=1) + insn(0xbf, 2, 1) + insn(0x37, 2, imm=7)
        + insn(0xa5, 1, off=-4, imm=k) + insn(0xb7, 0, imm=2) + insn(0x95))  # ...; return XDP_PASS
class Attr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16)]
code, lic = ctypes.create_string_buffer(prog, len(prog)), ctypes.create_string_buffer(b"GPL")
attr = Attr(prog_type=6, insn_cnt=len(prog) // 8, insns=ctypes.addressof(code), license=ctypes.addressof(lic),
            prog_name=b"shpd_test_burn")
nr = {"x86_64": 321, "aarch64": 280}[platform.machine()]
fn = ctypes.CDLL(None, use_errno=True).syscall
fd = fn(ctypes.c_long(nr), ctypes.c_int(5), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr)))
if fd < 0:
    sys.exit("load xdp: " + os.strerror(ctypes.get_errno()))
with IPRoute() as ipr:
    ipr.link("set", index=ipr.link_lookup(ifname=dev)[0], xdp_fd=fd)
with open("/sys/class/net/%s/threaded" % dev, "w") as f:
    f.write("1")
"""


def scrape(bed, path: str = "/metrics") -> tuple[int, str]:
    out = procs.run(["ip", "netns", "exec", bed.node, PY, "-c", SCRAPE, str(PORT), path], check=False).stdout
    code, _, body = out.partition("\n")
    return (int(code) if code.isdigit() else 0), body


def series(bed) -> dict[tuple[str, tuple], float]:
    code, body = scrape(bed)
    assert code == 200
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def tenant(name: str) -> tuple:
    return (("device", "up0"), ("path", "tc"), ("tenant", name))


def val(m: dict, metric: str, name: str) -> float:
    return m[(metric, tenant(name))]


def samples(m: dict) -> float:
    return m[("shaperd_sampler_samples_total", (("result", "success"),))]


def until(bed, pred, what: str) -> dict:
    """Scrape until ``pred(series)`` holds; that scrape's series."""
    last: dict = {}

    def done():
        nonlocal last
        last = series(bed)
        return pred(last)

    assert wait_for(done, DEADLINE, 0.2), f"{what}; last scrape: {sorted((k, v) for k, v in last.items() if 'tenant' in k[0])}"
    return last


def drained(bed, name: str) -> dict:
    """Scrape until a sample after the traffic stopped: backlog empty, bytes unchanged since an earlier sample."""
    prev: dict = {}

    def quiet(m):
        nonlocal prev
        ok = bool(prev) and samples(m) > samples(prev) and val(m, "shaperd_tenant_backlog_bytes", name) == 0 \
            and val(m, "shaperd_tenant_transmit_bytes_total", name) == val(prev, "shaperd_tenant_transmit_bytes_total", name)
        prev = m
        return ok

    return until(bed, quiet, f"{name}'s class never went quiet")


def send(bed, src: str, dst: str, size: int, count: int) -> None:
    procs.run(["ip", "netns", "exec", bed.node, PY, "-c", SENDER, src, dst, str(size), str(count)])


def flood(bed, src: str):
    """A flood from ``src`` that runs until the ``with`` block ends."""
    return procs.running(["ip", "netns", "exec", bed.node, PY, "-c", FLOOD, src, "198.18.0.2", FLOOD_CAP_S],
                         stop_timeout_s=5.0)


@pytest.fixture
def daemon(bed, tmp_path: Path):
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(CONFIG)
    log = tmp_path / "daemon.log"
    with open(log, "w") as logf, procs.running(
        ["ip", "netns", "exec", bed.node, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg),
         "--metrics-address", f"127.0.0.1:{PORT}", "--resync-interval", "600"],
        stdout=logf, stderr=subprocess.STDOUT,
    ) as proc:
        def ready():
            if proc.poll() is not None:
                pytest.fail(f"shaperd run exited: {log.read_text()[-3000:]}")
            code, _ = scrape(bed, "/readyz")
            if code != 200:
                return None
            m = series(bed)
            return m if ("shaperd_tenant_transmit_bytes_total", tenant("capped")) in m else None

        assert wait_for(ready, DEADLINE, 0.2), f"daemon never became ready with tenant series: {log.read_text()[-3000:]}"
        yield proc


def test_bytes_packets_guarantee_and_limit_per_tenant(bed, daemon):
    code, body = scrape(bed, "/healthz")
    assert code == 200, body
    m0 = series(bed)
    sends = {"alpha": ("198.18.1.1", 1000, 3000), "beta": ("198.18.2.1", 400, 2000)}
    for src, size, count in sends.values():
        send(bed, src, "198.18.0.2", size, count)
    packets = "shaperd_tenant_transmit_packets_total"
    m1 = until(bed, lambda m: all(val(m, packets, n) >= val(m0, packets, n) + c for n, (_, _, c) in sends.items()),
               "the sampler never saw every packet sent")
    for name, (_, size, count) in sends.items():
        sent = val(m1, "shaperd_tenant_transmit_bytes_total", name) - val(m0, "shaperd_tenant_transmit_bytes_total", name)
        assert sent == pytest.approx(count * (size + OVERHEAD), rel=0.02), name
        pk = val(m1, packets, name) - val(m0, packets, name)
        assert pk == count
        assert val(m1, "shaperd_tenant_dropped_packets_total", name) == val(m0, "shaperd_tenant_dropped_packets_total", name)
    # capped sent nothing.
    assert val(m1, "shaperd_tenant_transmit_bytes_total", "capped") == val(m0, "shaperd_tenant_transmit_bytes_total", "capped")
    assert val(m1, "shaperd_tenant_guarantee_bytes_per_second", "alpha") == 400e6 / 8
    assert val(m1, "shaperd_tenant_limit_bytes_per_second", "alpha") == 1e9 / 8  # no limit: capacity
    assert val(m1, "shaperd_tenant_guarantee_bytes_per_second", "beta") == 100e6 / 8
    assert val(m1, "shaperd_tenant_limit_bytes_per_second", "beta") == 500e6 / 8
    for name in ("alpha", "beta", "capped"):
        assert val(m1, "shaperd_tenant_below_guarantee_seconds_total", name) == 0
        assert m1[("shaperd_tenant_endpoints", (("kind", "cidr"), ("tenant", name)))] == 1
    assert not any(k[0].startswith("shaperd_tenant_pods") for k in m1)  # no Kubernetes discovery: no pod series
    assert m1[("shaperd_reconciles_total", ())] >= 1
    assert m1[("shaperd_config_reloads_total", (("result", "success"),))] == 1
    assert m1[("shaperd_scrape_collector_success", (("collector", "tenants"),))] == 1
    # The RDMA sampler runs beside the tc one; a node without RDMA devices has no RDMA series at all.
    assert m1[("shaperd_scrape_collector_success", (("collector", "rdma"),))] == 1
    assert not any(dict(k[1]).get("path") == "rdma" or k[0].startswith("shaperd_tenant_rdma") for k in m1)


def test_pressing_on_the_limit_is_borrowing_not_starvation(bed, daemon):
    """The flood presses on capped's limit (the kernel drops for it); its class sent no more than the limit allows
    over the time the kernel counted it (tests/integration/counted.py); what it sent above its guarantee is
    counted as borrowed, and none of it as time below the guarantee. No rate is asserted: a busy machine
    floods slower, and every check here holds at any speed."""
    capped = ROOT_HANDLE | assign_minors(["alpha", "beta", "capped"])["capped"]
    m0 = series(bed)
    k0 = counted.htb_classes(bed.node, "up0")
    sent_total = "shaperd_tenant_transmit_bytes_total"
    with flood(bed, "198.18.3.1") as proc:
        # Pressing on the limit, as the kernel says: drops in capped's class (its queue overflowed).
        pressed = wait_for(lambda: counted.pressed(k0, counted.htb_classes(bed.node, "up0"), capped), DEADLINE, 0.2)
        assert pressed, "the flood never pressed on capped's limit (no drop, no overlimit in its class)"
        seen = until(bed, lambda m: val(m, sent_total, "capped") > val(m0, sent_total, "capped"),
                     "the sampler never saw the flood in capped's class")
        until(bed, lambda m: samples(m) >= samples(seen) + 6, "the sampler stopped sampling")
        assert proc.poll() is None, "the flood ended before the test had seen it pressing"
        k1 = counted.htb_classes(bed.node, "up0")
    assert counted.over_limit(k0, k1, [capped]) == {}  # held to its limit, as the kernel counted
    assert k1.counters[capped].rate_Bps * 8 == 20 * 10**6
    m1 = drained(bed, "capped")
    d = lambda metric: val(m1, metric, "capped") - val(m0, metric, "capped")  # noqa: E731
    assert d("shaperd_tenant_dropped_packets_total") > 0
    assert d("shaperd_tenant_overlimits_total") > 0
    # Borrowed is, per sampling interval, what the class sent above guarantee * interval (report/sampler.py),
    # so over the samples from m0 to m1: sent - guarantee * (their time apart) <= borrowed <= sent. Their time
    # apart is read from the samples' wall-clock stamps, taken a moment after the monotonic one the sampler
    # integrates with: one sampling period (0.5 s) of slack covers that.
    sent = d(sent_total)
    sampled_s = m1[("shaperd_sampler_last_success_timestamp_seconds", ())] - m0[
        ("shaperd_sampler_last_success_timestamp_seconds", ())] + 0.5
    guarantee_Bps = val(m1, "shaperd_tenant_guarantee_bytes_per_second", "capped")
    borrowed = d("shaperd_tenant_borrowed_bytes_total")
    assert sent > 0 and sent - guarantee_Bps * sampled_s <= borrowed <= sent, (sent, sampled_s, borrowed)
    # Pressing on a limit above the guarantee: it had demand and was never below its guarantee.
    assert d("shaperd_tenant_below_guarantee_seconds_total") == 0


def test_starved_tenant_counts_time_below_guarantee(bed, daemon):
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if release < VETH_BACKPRESSURE:
        pytest.skip(f"Linux {os.uname().release}: veth gives no qdisc backpressure before 6.15, no HTB backlog can build")
    # From here on the kernel can do it: anything that does not work is a failure, not a skip.
    r = procs.run(["ip", "netns", "exec", bed.peer, PY, "-c", BURNER, "up1", "100000"], check=False)
    assert r.returncode == 0, f"cannot emulate a slow NIC (XDP on veth): {r.stderr.strip()}"
    below = "shaperd_tenant_below_guarantee_seconds_total"
    m0 = series(bed)
    started = time.monotonic()
    with flood(bed, "198.18.1.1") as proc:
        until(bed, lambda m: val(m, "shaperd_tenant_backlog_bytes", "alpha") > 0,
              "no queue built up in alpha's HTB class although veth pushes back on this kernel")
        mid = until(bed, lambda m: val(m, below, "alpha") - val(m0, below, "alpha") >= 2.0,
                    "a backlogged tenant under its guarantee was not counted as starved")
        assert proc.poll() is None, "the flood ended early"
    m1 = drained(bed, "alpha")
    elapsed = time.monotonic() - started
    rate = 8 * val(mid, "shaperd_tenant_transmit_rate_bytes_per_second", "alpha")
    assert rate < 0.8 * 400e6, f"not starved: {rate / 1e6:.0f} Mbit/s"
    counted = val(m1, below, "alpha") - val(m0, below, "alpha")
    # Every counted interval began with a queue the flood built: never more than the time since it started.
    assert 2.0 <= counted <= elapsed, f"counted {counted:.1f} s in {elapsed:.1f} s"
    for idle in ("beta", "capped"):  # no demand, no starvation
        assert val(m1, below, idle) == 0


def test_top_prints_plain_rows_per_tenant_when_not_a_terminal(bed, daemon, tmp_path):
    send(bed, "198.18.2.1", "198.18.0.2", 1000, 500)
    out = procs.run(["ip", "netns", "exec", bed.node, PY, "-m", "shaperd", "--log-json", "top",
                     "--config", str(tmp_path / "tenants.yaml"), "-n", "2", "--interval", "0.3"], check=False)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout
    views = [v for v in out.stdout.split("shaperd top") if v.strip()]
    assert len(views) == 2
    for name in ("alpha", "beta", "capped"):
        assert f"\n{name} " in views[-1]
    assert "100Mbps" in views[-1] and "500Mbps" in views[-1]  # beta's guarantee and limit
