"""Issue 13: the agent works with the capabilities the DaemonSet and the systemd unit grant.

With a bpffs to pin in (a private mount here, /sys/fs/bpf on a node) the eBPF map classifier is in
use under those capabilities: a restarted agent adopts it through its pins with no write.

Both grant CAP_NET_ADMIN and CAP_BPF only (no SYS_ADMIN). ``setpriv`` limits the
bounding set before exec, so the root process under test holds exactly those two.
And as a Type=notify service: a real ``shaperd run`` sends READY=1, feeds the watchdog,
reports RELOADING=1 then READY=1 on SIGHUP and STOPPING=1 on SIGTERM, read from a
socket the test binds (the datagrams systemd would get).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from tests import procs

from .conftest import PY, needs_root, wait_for

pytestmark = [needs_root, pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")]

LEAST = ["setpriv", "--bounding-set=-all,+net_admin,+bpf", "--inh-caps=-all"]
CFG = """node:
  interfaces: [up0]
  capacity: 10Gbps
tenants:
  - name: "tenant-a"
    bandwidthGuarantee: 4Gbps
    bandwidthLimit: 6Gbps
    priority: 100
    match: {cidrs: [198.18.1.0/24]}
"""


def test_probe_without_sys_admin_chooses_bpffs_pins_for_the_map_classifier(pinfs):
    code = ("from shaperd.engine.probe import probe_capabilities as p; import json, sys; c = p(bpffs_root=sys.argv[1]); "
            "print(json.dumps({'maps': c.bpf_maps, 'adopt': c.bpf_adopt, 'notes': list(c.notes)}))")
    r = procs.run([*LEAST, PY, "-c", code, str(pinfs)], timeout_s=60)
    got = json.loads(r.stdout)
    assert got["maps"] is True and got["adopt"] == "pins", got["notes"]
    assert any(f"through bpffs pins under {pinfs}" in n for n in got["notes"]), got["notes"]
    assert sorted(p.name for p in pinfs.iterdir()) == ["maps.debug", "progs.debug", "shaperd"]
    assert list((pinfs / "shaperd").iterdir()) == []  # the probe removed its own pins


def test_probe_without_sys_admin_finds_cls_bpf_and_refuses_the_map_classifier_it_could_not_adopt():
    code = ("from shaperd.engine.probe import probe_capabilities as p; import json; c = p(); "
            "print(json.dumps({'bpf': c.bpf, 'maps': c.bpf_maps, 'htb': c.htb, 'notes': list(c.notes)}))")
    r = procs.run([*LEAST, PY, "-c", code], timeout_s=60)
    got = json.loads(r.stdout)
    assert got["htb"] and any("capability probe skipped" in n for n in got["notes"])
    assert got["bpf"] is True, got["notes"]  # CAP_BPF + CAP_NET_ADMIN load SCHED_CLS (5.8+)
    # Without a bpffs the eBPF map classifier loads, but cannot be read back by id (BPF_*_GET_FD_BY_ID
    # need CAP_SYS_ADMIN): the probe must choose u32, or every reconcile would reinstall it.
    assert got["maps"] is False and any("need CAP_SYS_ADMIN" in n and "not permitted" in n for n in got["notes"]), got["notes"]


def test_with_every_capability_the_map_classifier_probe_succeeds():
    # The check above can pass: as plain root the same probe adopts what it loaded.
    code = "from shaperd.backends.common import kernel_classifier as b; print(b.probe_load())"
    r = procs.run([PY, "-c", code], timeout_s=60)
    assert r.stdout.strip() == "('id', 'by id (bpffs pins: no bpffs root configured)')", r.stdout + r.stderr


def test_apply_with_net_admin_and_bpf_only_builds_the_tree_and_a_second_apply_changes_nothing(bed, tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    first = bed.exec(*LEAST, PY, "-m", "shaperd", "--log-json", "apply", "--config", str(cfg), check=False)
    assert first.returncode == 0, first.stderr
    qd = json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
    assert any(q["kind"] == "htb" and q.get("root") for q in qd), qd  # the root HTB shaperd owns
    assert not first.stdout.splitlines()[-1].startswith("0 "), first.stdout  # the first apply wrote
    again = bed.exec(*LEAST, PY, "-m", "shaperd", "--log-json", "apply", "--config", str(cfg), check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].startswith("0 "), again.stdout  # read, diff, no write


def _recv_until(sock: socket.socket, want: str, deadline_s: float) -> list[dict[str, str]]:
    """Datagrams until one carries ``want`` (KEY=value), with a deadline that only bounds a failure."""
    got = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            data = sock.recv(4096).decode()
        except TimeoutError:
            break
        msg = dict(line.split("=", 1) for line in data.splitlines())
        got.append(msg)
        k, v = want.split("=", 1)
        if msg.get(k) == v:
            return got
    raise AssertionError(f"no {want} within {deadline_s}s; got {got}")


def test_run_as_a_notify_service_ready_watchdog_reload_stop(bed, tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)  # subscribed before the daemon starts
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000")  # a feed due every 0.5 s
    p = bed.spawn([*LEAST, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--metrics-address", ""],
                  bed.node, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ready = _recv_until(sock, "READY=1", 60)[-1]
        assert "1 tenants" in ready["STATUS"], ready
        _recv_until(sock, "WATCHDOG=1", 10)
        _recv_until(sock, "WATCHDOG=1", 10)  # fed again: a loop that keeps going
        os.kill(p.pid, signal.SIGHUP)  # by id: `ip netns exec` and setpriv exec, so this is the agent
        _recv_until(sock, "RELOADING=1", 10)
        _recv_until(sock, "READY=1", 10)
        os.kill(p.pid, signal.SIGTERM)
        _recv_until(sock, "STOPPING=1", 10)
        assert p.wait(timeout=20) == 0
    finally:
        sock.close()
        procs.stop(p)


METRICS_PORT = 19417
SCRAPE = ("import sys, urllib.request; "
          "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=20).read().decode())")


def _egress_prog_id(bed) -> int:
    out = json.loads(bed.exec("tc", "-j", "filter", "show", "dev", "up0", "egress").stdout or "[]")
    (pid,) = [f["options"]["prog"]["id"] for f in out if "shpd_c" in f.get("options", {}).get("bpf_name", "")]
    return pid


def _run_once(bed, cfg, pinfs, tmp_path, n: int) -> list[dict]:
    """One `shaperd run` with exactly NET_ADMIN+BPF until READY; the metric read; SIGTERM. Its log lines."""
    path = str(tmp_path / f"notify{n}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)  # subscribed before the daemon starts
    log = tmp_path / f"run{n}.log"
    env = dict(os.environ, NOTIFY_SOCKET=path)
    with open(log, "w") as logf:
        p = bed.spawn([*LEAST, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--bpffs-root",
                       str(pinfs), "--metrics-address", f"127.0.0.1:{METRICS_PORT}", "--resync-interval", "600"],
                      bed.node, env=env, stdout=logf, stderr=subprocess.STDOUT)
        try:
            _recv_until(sock, "READY=1", 60)
            metrics = wait_for(lambda: bed.exec(PY, "-c", SCRAPE, str(METRICS_PORT), check=False).stdout, 20)
            assert 'shaperd_classifier_info{device="up0",path="ebpf"} 1.0' in metrics, metrics[-2000:]
            os.kill(p.pid, signal.SIGTERM)
            assert p.wait(timeout=20) == 0
        finally:
            sock.close()
            procs.stop(p)
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_run_with_net_admin_and_bpf_only_uses_the_map_classifier_and_a_restart_adopts_it_through_pins(
        bed, tmp_path, pinfs):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(CFG)
    first = _run_once(bed, cfg, pinfs, tmp_path, 1)
    changes = [r for r in first if r.get("event") == "kernel change"]
    assert any("attach bpf classifier" in r["change"] for r in changes), changes
    prog_id = _egress_prog_id(bed)
    pins = pinfs / "shaperd" / "host" / "htb" / "up0"  # `ip netns exec` without --netns: scope "host"
    assert (pins / "prog").exists() and (pins / "map_src4").exists()

    second = _run_once(bed, cfg, pinfs, tmp_path, 2)  # a new process, still without CAP_SYS_ADMIN
    assert [r for r in second if r.get("event") == "kernel change"] == [], second
    assert any("through bpffs pins" in c for r in second for c in r.get("capabilities", [])), second
    assert _egress_prog_id(bed) == prog_id  # adopted through the pins, not replaced

    st = bed.exec(*LEAST, PY, "-m", "shaperd", "status", "--config", str(cfg), "--json", "--interval", "0.05")
    assert json.loads(st.stdout.splitlines()[-1])["classifier"]["up0"]["path"] == "ebpf"

    td = bed.exec(*LEAST, PY, "-m", "shaperd", "teardown", "--bpffs-root", str(pinfs), check=False)
    assert td.returncode == 0, td.stderr
    assert not pins.exists() and list(pins.parent.iterdir()) == []  # its pins went with the rest
