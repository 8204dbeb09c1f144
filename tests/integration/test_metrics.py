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
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

PORT = 9567
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
    bandwidthGuarantee: 50Mbps
    bandwidthLimit: 100Mbps
    priority: 5
    match: {cidrs: [198.18.3.0/24]}
"""
# What one UDP datagram costs HTB on an Ethernet veth: payload + UDP 8 + IPv4 20 + Ethernet 14.
OVERHEAD = 8 + 20 + 14

SCRAPE = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=5)
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
    out = bed.exec(PY, "-c", SCRAPE, str(PORT), path, check=False).stdout
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


@pytest.fixture
def daemon(bed, tmp_path: Path):
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(CONFIG)
    proc = bed.start_daemon(cfg, "--metrics-address", f"127.0.0.1:{PORT}", "--resync-interval", "600")

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"shaperd run exited: {proc.stdout.read()}")
        code, _ = scrape(bed, "/readyz")
        if code != 200:
            return None
        m = series(bed)
        return m if ("shaperd_tenant_transmit_bytes_total", tenant("capped")) in m else None

    assert wait_for(ready, 20, 0.2), "daemon never became ready with tenant series"
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def settled(bed, metric: str, name: str, want: float, timeout: float = 5.0) -> dict:
    """Scrape until the sampler has seen ``metric`` reach ``want`` (it samples every 0.5 s)."""
    last = {}

    def done():
        nonlocal last
        last = series(bed)
        return val(last, metric, name) >= want

    wait_for(done, timeout, 0.3)
    return last


def test_bytes_packets_guarantee_and_limit_per_tenant(bed, daemon):
    code, body = scrape(bed, "/healthz")
    assert code == 200, body
    m0 = series(bed)
    sends = {"alpha": ("198.18.1.1", 1000, 3000), "beta": ("198.18.2.1", 400, 2000)}
    for src, size, count in sends.values():
        bed.send(src, "198.18.0.2", size, count)
    m1 = settled(bed, "shaperd_tenant_transmit_packets_total", "beta",
                 val(m0, "shaperd_tenant_transmit_packets_total", "beta") + 2000)
    m1 = settled(bed, "shaperd_tenant_transmit_packets_total", "alpha",
                 val(m0, "shaperd_tenant_transmit_packets_total", "alpha") + 3000)
    for name, (_, size, count) in sends.items():
        sent = val(m1, "shaperd_tenant_transmit_bytes_total", name) - val(m0, "shaperd_tenant_transmit_bytes_total", name)
        assert sent == pytest.approx(count * (size + OVERHEAD), rel=0.02), name
        pk = val(m1, "shaperd_tenant_transmit_packets_total", name) - val(m0, "shaperd_tenant_transmit_packets_total", name)
        assert pk == count
        assert val(m1, "shaperd_tenant_dropped_packets_total", name) == val(m0, "shaperd_tenant_dropped_packets_total", name)
    # capped sent nothing.
    assert val(m1, "shaperd_tenant_transmit_bytes_total", "capped") == val(m0, "shaperd_tenant_transmit_bytes_total", "capped")
    assert val(m1, "shaperd_tenant_guarantee_bits_per_second", "alpha") == 400e6
    assert val(m1, "shaperd_tenant_limit_bits_per_second", "alpha") == 1e9  # no limit: capacity
    assert val(m1, "shaperd_tenant_guarantee_bits_per_second", "beta") == 100e6
    assert val(m1, "shaperd_tenant_limit_bits_per_second", "beta") == 500e6
    for name in ("alpha", "beta", "capped"):
        assert val(m1, "shaperd_tenant_below_guarantee_seconds_total", name) == 0
        assert m1[("shaperd_tenant_endpoints", (("kind", "cidr"), ("tenant", name)))] == 1
    assert not any(k[0].startswith("shaperd_tenant_pods") for k in m1)  # no pod source yet: no series
    assert m1[("shaperd_reconciles_total", ())] >= 1
    assert m1[("shaperd_config_reloads_total", (("result", "success"),))] == 1
    assert m1[("shaperd_scrape_collector_success", (("collector", "tenants"),))] == 1
    # The RDMA sampler runs beside the tc one; a node without RDMA devices has no RDMA series at all.
    assert m1[("shaperd_scrape_collector_success", (("collector", "rdma"),))] == 1
    assert not any(dict(k[1]).get("path") == "rdma" or k[0].startswith("shaperd_tenant_rdma") for k in m1)


def test_pressing_on_the_limit_is_borrowing_not_starvation(bed, daemon):
    m0 = series(bed)
    flood = subprocess.Popen(["ip", "netns", "exec", bed.node, PY, "-c", FLOOD, "198.18.3.1", "198.18.0.2", "4"])
    bed.procs.append(flood)
    time.sleep(3.0)
    mid = series(bed)
    flood.wait(timeout=15)
    time.sleep(1.0)
    m1 = series(bed)
    rate = val(mid, "shaperd_tenant_transmit_rate_bits_per_second", "capped")
    assert rate == pytest.approx(100e6, rel=0.15)  # held at its limit
    d = lambda metric: val(m1, metric, "capped") - val(m0, metric, "capped")  # noqa: E731
    assert d("shaperd_tenant_dropped_packets_total") > 0
    assert d("shaperd_tenant_overlimits_total") > 0
    # ~4 s at 100 Mbit/s with a 50 Mbit/s guarantee: ~25 MB above the guarantee.
    assert 0.6 * 25e6 < d("shaperd_tenant_borrowed_bytes_total") < 1.3 * 25e6
    assert d("shaperd_tenant_below_guarantee_seconds_total") == 0


def test_starved_tenant_counts_time_below_guarantee(bed, daemon):
    r = bed.exec(PY, "-c", BURNER, "up1", "100000", ns=bed.peer, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot emulate a slow NIC here (XDP on veth): {r.stderr.strip()}")
    m0 = series(bed)
    flood = subprocess.Popen(["ip", "netns", "exec", bed.node, PY, "-c", FLOOD, "198.18.1.1", "198.18.0.2", "5"])
    bed.procs.append(flood)
    time.sleep(3.5)
    mid = series(bed)
    flood.wait(timeout=20)
    time.sleep(1.0)
    m1 = series(bed)
    rate = val(mid, "shaperd_tenant_transmit_rate_bits_per_second", "alpha")
    if val(mid, "shaperd_tenant_backlog_bytes", "alpha") == 0 or rate > 0.8 * 400e6:
        pytest.skip(f"no queue built up in HTB (rate {rate / 1e6:.0f} Mbit/s): this kernel's veth gives no qdisc backpressure")
    below = val(m1, "shaperd_tenant_below_guarantee_seconds_total", "alpha") - val(m0, "shaperd_tenant_below_guarantee_seconds_total", "alpha")
    assert below >= 2.0, f"starved for ~5 s at {rate / 1e6:.0f} Mbit/s, counted {below:.1f} s"
    assert below <= 6.5
    for idle in ("beta", "capped"):  # no demand, no starvation
        assert val(m1, "shaperd_tenant_below_guarantee_seconds_total", idle) == 0


def test_top_prints_plain_rows_per_tenant_when_not_a_terminal(bed, daemon, tmp_path):
    bed.send("198.18.2.1", "198.18.0.2", 1000, 500)
    out = bed.shaperd("top", "--config", str(tmp_path / "tenants.yaml"), "-n", "2", "--interval", "0.3")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout
    views = [v for v in out.stdout.split("shaperd top") if v.strip()]
    assert len(views) == 2
    for name in ("alpha", "beta", "capped"):
        assert f"\n{name} " in views[-1]
    assert "100Mbps" in views[-1] and "500Mbps" in views[-1]  # beta's guarantee and limit
