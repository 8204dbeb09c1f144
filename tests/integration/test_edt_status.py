"""``shaperd status`` shows the edt data plane's tenants, read from a real stamper's maps (root).

The host kernel has no sch_fq, so not the edt backend: the kernel functions it uses build its
root (mq 7365: on a 4-queue veth, pfifo_fast under it) and its stamper on clsact egress, loaded
with the "edt-stamper" PinStore on a private bpffs (as the backend pins it). Traffic is UDP
with SO_PRIORITY = the tenant's class id (what the map classifier writes), from a namespace
this test creates to its peer (198.18.0.0/15). The real CLI reads it back: the rate written
into the map and the bytes counted, as root (through the pins) and under NET_ADMIN+BPF only
(setpriv: no CAP_SYS_ADMIN) through the pins; without pins there, one error line and exit 1.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shaperd.backends.edt import controller
from shaperd.backends.edt import ops as edt_ops
from shaperd.backends.edt.objects import DEFAULT_KEY, ROOT_HANDLE, Stamper, stamper_name
from shaperd.core.ids import assign_minors
from shaperd.backends.common.clsact import AddClsact
from shaperd.backends.edt.kernel_tc import CODEC as EDT_CODEC
from shaperd.kernel import bpf_pins
from shaperd.backends.edt import kernel_stamper as edt_prog
from shaperd.kernel import tc
from shaperd.kernel.rtnl import RtnlReader
from shaperd_bed import netns
from tests import procs

from .conftest import PY, needs_root

pytestmark = needs_root
LEAST = ["setpriv", "--bounding-set=-all,+net_admin,+bpf", "--inh-caps=-all"]  # as test_least_caps.py
HORIZON_NS = 100_000_000
TRAIN_BPS = 2_000_000_000
CFG = """node: {interfaces: [st0], dataplane: edt, capacity: 10Gbps}
tenants:
  - {name: train, bandwidthGuarantee: 3Gbps, priority: 100, match: {cidrs: [198.18.1.0/24]}}
  - {name: batch, bandwidthGuarantee: 1Gbps, bandwidthLimit: 5Gbps, match: {cidrs: [198.18.2.0/24]}}
"""
MINORS = assign_minors(["train", "batch"])
PACKETS, PAYLOAD = 25, 1000
WIRE = PAYLOAD + 8 + 20 + 14  # skb->len on clsact egress: UDP, IPv4 and Ethernet headers
SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, int(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    s.sendto(b"x" * int(sys.argv[3]), ("198.18.0.2", 9))
"""


@pytest.fixture
def edt_node(pinfs, tmp_path):
    """Namespace with veth st0 (4 TX queues) carrying the edt root and the stamper pinned under ``pinfs``;
    its peer st1 in a second namespace. Yields (namespace, tenants file, the stamper's PinStore)."""
    with netns.Namespaces(stop_grace_s=0) as nets:
        ns, peer = nets.add(f"edtst-{os.getpid()}"), nets.add(f"edtsp-{os.getpid()}")
        netns.run(["ip", "-n", ns, "link", "add", "st0", "numtxqueues", "4", "type", "veth", "peer", "name", "st1",
                   "numtxqueues", "4", "netns", peer])
        netns.addr(ns, "st0", "198.18.0.1/24")
        netns.addr(peer, "st1", "198.18.0.2/24")
        for n, dev in ((ns, "st0"), (peer, "st1")):
            netns.run(["ip", "-n", n, "link", "set", dev, "up"])
        netns.run(["ip", "-n", ns, "neigh", "replace", "198.18.0.2", "lladdr", "02:00:00:00:00:02", "dev", "st0"])
        store = bpf_pins.PinStore(pinfs, "host").sub(edt_prog.STAMPER_PINS)  # `ip netns exec`: scope "host"
        with RtnlReader(ns) as reader:
            link = next(l for l in reader.links() if l.name == "st0")
            assert link.tx_queues == 4
            writer = tc.open_writer(ns)
            try:
                kw = dict(device="st0", ifindex=link.ifindex)
                q16 = ((MINORS["train"], controller.ns_per_byte_q16(TRAIN_BPS)),)
                res = tc.apply_ops(writer, [
                    edt_ops.SetRoot(kind="mq", handle=ROOT_HANDLE, **kw), AddClsact(**kw),
                    edt_ops.SetStamper(stamper=Stamper(stamper_name(HORIZON_NS), HORIZON_NS), initial_q16=q16, **kw),
                ], pins=store, codec=EDT_CODEC)
            finally:
                writer.close()
            assert res.failed == [] and not res.batch_failed, res.failed
        cfg = tmp_path / "tenants.yaml"
        cfg.write_text(CFG)
        yield ns, cfg, store


def _send(ns: str, minor: int) -> None:
    procs.run(["ip", "netns", "exec", ns, PY, "-c", SEND, str(0x7368 << 16 | minor), str(PACKETS), str(PAYLOAD)],
              timeout_s=30)


def _status(ns: str, cfg, bpffs: str, *wrap: str, check: bool = True):
    return procs.run(["ip", "netns", "exec", ns, *wrap, PY, "-m", "shaperd", "status", "-o", "json", "--config",
                      str(cfg), "--bpffs-root", bpffs, "--interval", "0.05"], timeout_s=60, check=check)


def _rows(out: str) -> dict[str, dict]:
    doc = json.loads(out.splitlines()[-1])
    assert doc["edt_errors"] == [], doc["edt_errors"]
    return {r["tenant"]: r for r in doc["edt"] if r["device"] == "st0"}


def test_status_shows_the_rate_in_the_map_and_the_bytes_the_stamper_counted(edt_node, pinfs):
    ns, cfg, _store = edt_node
    _send(ns, MINORS["train"])
    rows = _rows(_status(ns, cfg, str(pinfs)).stdout)
    assert set(rows) == {"train", "batch", "(none)"}
    train, batch = rows["train"], rows["batch"]
    assert train["key"] == MINORS["train"] and train["classid"] == f"7368:{MINORS['train']:x}"
    assert train["map_rate_bps"] == controller.rate_bps_of_q16(controller.ns_per_byte_q16(TRAIN_BPS)) == TRAIN_BPS
    assert (train["packets"], train["bytes"], train["drops"]) == (PACKETS, PACKETS * WIRE, 0)
    assert (train["guarantee_bps"], train["limit_bps"]) == (3_000_000_000, 10_000_000_000)
    assert train["rate_bps"] == 0  # nothing sent during status's window: read, not guessed
    assert batch["map_rate_bps"] is None and batch["bytes"] == 0 and batch["limit_bps"] == 5_000_000_000
    assert rows["(none)"]["key"] == DEFAULT_KEY


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")
def test_with_net_admin_and_bpf_only_status_reads_through_the_pins_and_without_them_says_what_is_missing(
        edt_node, pinfs):
    ns, cfg, store = edt_node
    _send(ns, MINORS["batch"])
    rows = _rows(_status(ns, cfg, str(pinfs), *LEAST).stdout)
    assert rows["batch"]["packets"] == PACKETS and rows["batch"]["bytes"] == PACKETS * WIRE
    assert rows["train"]["map_rate_bps"] == TRAIN_BPS
    # No bpffs root: by program id, which needs CAP_SYS_ADMIN: one error naming the device, exit 1.
    r = _status(ns, cfg, "", *LEAST, check=False)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    assert [r for r in doc["edt"] if r["device"] == "st0"] == []  # no zeros in place of what was not read
    (err,) = doc["edt_errors"]
    assert err["device"] == "st0" and "read edt stamper maps on st0" in err["error"]
    assert "CAP_SYS_ADMIN" in err["error"] and "Traceback" not in r.stderr
    assert "shaperd: read edt stamper maps on st0" in r.stderr
    # A pin of another program (loaded and pinned, never attached) is refused, not read.
    os.close(edt_prog.load_fresh(HORIZON_NS, {}, store, "st0"))
    r = _status(ns, cfg, str(pinfs), *LEAST, check=False)
    assert r.returncode == 1 and "is not the attached id" in json.loads(r.stdout.splitlines()[-1])["edt_errors"][0][
        "error"]
