"""A node with a foreign root qdisc on one uplink: the daemon says "degraded", with the reason, everywhere.

The bed's node gets a second uplink whose root qdisc (tbf 1:) someone else installed. ``shaperd run``
enforces the other uplink and leaves that one alone; then, read from where an operator reads them:
systemd's STATUS= (datagrams on a socket the test binds as NOTIFY_SOCKET), /healthz and /readyz, the
``shaperd_degraded_targets`` gauge, and ``shaperd status`` (text, -o json, exit code). The watchdog
stays fed while degraded. Once the foreign qdisc is removed, the next reconcile (woken by the tc
event) says "in sync" and the gauge drops to 0. Every wait is on a condition, with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families
from shaperd_bed import netns

from tests import procs

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

PORT = 9567  # inside the bed's node namespace: no other test's port
DEADLINE_S = 60.0  # bounds a failure only
CONFIG = """node:
  interfaces: [up0, up2]
  capacity: 1Gbps
tenants:
  - name: tenant-a
    bandwidthGuarantee: 100Mbps
    priority: 10
    match: {cidrs: [198.18.1.0/24]}
"""
REASON = ("htb up2: root qdisc tbf 1: is not shaperd's; left alone "
          "(set node.takeOver or pass --take-over to replace it)")
LINE = f"degraded: 1 target not enforced ({REASON})"
SCRAPE = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=20)
    print(r.status); sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); sys.stdout.write(e.read().decode())
except OSError as e:
    print(0); sys.stdout.write(str(e))
"""


def scrape(bed, path: str) -> tuple[int, str]:
    out = bed.exec(PY, "-c", SCRAPE, str(PORT), path, check=False).stdout
    code, _, body = out.partition("\n")
    return (int(code) if code.isdigit() else 0), body


def degraded_gauge(bed) -> dict[str, float] | None:
    code, body = scrape(bed, "/metrics")
    if code != 200:
        return None
    return {s.labels["kind"]: s.value for fam in text_string_to_metric_families(body)
            if fam.name == "shaperd_degraded_targets" for s in fam.samples} or None


class Notifications:
    """The datagrams systemd would get, as KEY=value dicts, in order."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)  # before the daemon starts: nothing is missed
        self.got: list[dict[str, str]] = []

    def until(self, pred, deadline_s: float = DEADLINE_S) -> dict[str, str]:
        """The first datagram from now on for which ``pred`` holds; the deadline only bounds a failure."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self.sock.settimeout(max(0.05, end - time.monotonic()))
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            msg = dict(line.split("=", 1) for line in data.splitlines())
            self.got.append(msg)
            if pred(msg):
                return msg
        raise AssertionError(f"no such datagram within {deadline_s}s; got {self.got}")

    def close(self) -> None:
        self.sock.close()


def test_a_foreign_root_qdisc_on_one_uplink_is_degraded_in_status_health_metric_and_cli(bed, tmp_path):
    netns.veth("up2", bed.node, "up3", bed.peer)
    bed.exec("tc", "qdisc", "add", "dev", "up2", "root", "handle", "1:", "tbf", "rate", "1gbit", "burst", "32k",
             "latency", "50ms")
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(CONFIG)
    notes = Notifications(str(tmp_path / "notify"))
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="1000000")  # fed every 0.5 s
    log = tmp_path / "daemon.log"
    with open(log, "w") as logf:
        p = bed.spawn([PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--metrics-address",
                       f"127.0.0.1:{PORT}", "--resync-interval", "600"], bed.node, env=env, stdout=logf,
                      stderr=subprocess.STDOUT)
    try:
        # systemd: READY=1 only once the first reconcile ran, and until then STATUS= says what it waits for
        ready = notes.until(lambda m: m.get("READY") == "1")
        waiting = [m["STATUS"] for m in notes.got[:-1] if "STATUS" in m]
        assert waiting and all(s.startswith("waiting for the first reconcile: ") for s in waiting), notes.got
        assert ready["STATUS"] == f"1 tenants, 1 reconciles, {LINE}", ready
        # a degraded node keeps the watchdog fed: a restart does not remove someone else's qdisc
        notes.until(lambda m: m.get("WATCHDOG") == "1")
        notes.until(lambda m: m.get("WATCHDOG") == "1")

        # the kernel: the uplink that is shaperd's is enforced, the other one left as it was
        up0 = json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
        up2 = json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "up2").stdout)
        assert any(q["kind"] == "htb" and q.get("root") for q in up0), up0
        assert [q["kind"] for q in up2 if q.get("root")] == ["tbf"], up2

        # /healthz and /readyz: alive and ready (a restart or a stalled rollout would not help), and why
        assert wait_for(lambda: degraded_gauge(bed), DEADLINE_S, 0.2) == {"blocked": 1.0, "problem": 0.0}, \
            log.read_text()[-3000:]
        code, body = scrape(bed, "/healthz")
        assert code == 200 and body.startswith("ok: loop last ticked ") and body.rstrip().endswith(f"; {LINE}"), body
        assert scrape(bed, "/readyz") == (200, f"ready: {LINE}\n")

        # shaperd status: the same line last, the same summary in -o json, exit 1 (a target left alone)
        st = bed.shaperd("status", "--config", str(cfg), "--interval", "0.05")
        assert st.returncode == 1, st.stdout + st.stderr
        assert st.stdout.rstrip().splitlines()[-1] == LINE, st.stdout
        sj = bed.shaperd("status", "--config", str(cfg), "--interval", "0.05", "-o", "json")
        assert sj.returncode == 1, sj.stderr
        doc = json.loads(sj.stdout.splitlines()[-1])["degraded"]
        assert doc["count"] == 1 and doc["summary"] == LINE and doc["problems"] == []
        assert [(b["backend"], b["target"]) for b in doc["blocked"]] == [("htb", "up2")]

        # the foreign qdisc goes: the tc event wakes a reconcile, which takes up2, and everything says so
        bed.exec("tc", "qdisc", "del", "dev", "up2", "root")
        notes.until(lambda m: m.get("STATUS", "").endswith("reconciles, in sync"))
        assert wait_for(lambda: degraded_gauge(bed) == {"blocked": 0.0, "problem": 0.0}, DEADLINE_S, 0.2)
        assert scrape(bed, "/readyz") == (200, "ready: ok\n")
        st = bed.shaperd("status", "--config", str(cfg), "--interval", "0.05")
        assert st.returncode == 0 and "degraded" not in st.stdout, st.stdout + st.stderr

        os.kill(p.pid, signal.SIGTERM)  # by id: `ip netns exec` execs, so this is the agent
        notes.until(lambda m: m.get("STOPPING") == "1")
        assert p.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        notes.close()
        procs.stop(p)
