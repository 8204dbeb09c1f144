"""Namespaces for integration tests: made per test, removed even when the test fails.

Every address is from 198.18.0.0/15 or 2001:db8::/32; traffic never leaves
namespaces the tests create.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shaperd_bed import netns

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"),
    reason="needs root, iproute2 and network namespaces",
)

SENDER = r"""
import socket, sys
src, dst, size, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
if src != "-":
    s.bind((src, 0))
for _ in range(count):
    s.sendto(b"x" * size, (dst, 9))
"""


def run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """A short command in this namespace (``netns.run``: own process group, deadline, text output)."""
    return netns.run(argv, check=check, **kw)


class Bed:
    """A node namespace with an uplink veth to a peer namespace (and optional pods).

    A thin user of ``shaperd_bed.netns``: the namespaces and every process
    started here (``start_daemon``, or handed over with ``procs.append``) are
    ended and removed by ``cleanup``, also when the test failed.
    """

    DAEMON_DEADLINE_S = 600.0  # far beyond any test; a hung test's daemon still ends

    def __init__(self, tag: str):
        self.tag = tag
        self.node = f"{tag}-node"
        self.peer = f"{tag}-peer"
        self.nets = netns.Namespaces(stop_grace_s=0)  # tests need no graceful exit: KILL at once
        self.procs = self.nets.procs

    @property
    def namespaces(self) -> list[str]:
        return self.nets.names

    def ns(self, name: str) -> str:
        return self.nets.add(name)

    def build(self) -> "Bed":
        self.ns(self.node)
        self.ns(self.peer)
        netns.veth("up0", self.node, "up1", self.peer)
        self.addr(self.node, "up0", "198.18.0.1/24", "198.18.1.1/24", "198.18.2.1/24", "198.18.3.1/24",
                  "2001:db8:1::1/64")
        self.addr(self.peer, "up1", "198.18.0.2/24", "2001:db8:1::2/64")
        run("ip", "-n", self.node, "route", "add", "default", "via", "198.18.0.2")
        # Static neighbours: no ARP/ND chatter in the counters.
        peer_mac = netns.link(self.peer, "up1")["address"]
        netns.neigh(self.node, "up0", "198.18.0.2", peer_mac)
        netns.neigh(self.node, "up0", "2001:db8:1::2", peer_mac)
        return self

    def addr(self, ns: str, dev: str, *cidrs: str) -> None:
        netns.addr(ns, dev, *cidrs)

    def exec(self, *argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return netns.run(argv, ns or self.node, check=check)

    def shaperd(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return self.exec(PY, "-m", "shaperd", "--log-json", *args, check=check)

    def spawn(self, argv: list[str], ns: str | None = None, **kw) -> subprocess.Popen:
        """A long-running process (in *ns*; None: this namespace), ended by cleanup or its deadline."""
        kw.setdefault("deadline_s", self.DAEMON_DEADLINE_S)
        return self.nets.spawn(argv, ns, **kw)

    def start_daemon(self, config: Path, *extra: str) -> subprocess.Popen:
        return self.spawn([PY, "-m", "shaperd", "--log-json", "run", "--config", str(config), *extra], self.node,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def send(self, src: str, dst: str, size: int, count: int, ns: str | None = None) -> None:
        self.exec(PY, "-c", SENDER, src, dst, str(size), str(count), ns=ns)

    def tc_json(self, *what: str) -> list:
        return json.loads(self.exec("tc", "-j", "-s", *what).stdout or "[]")

    def cleanup(self) -> None:
        self.nets.cleanup()
        from shaperd.backends.podingress import labels as podingress_labels  # the capped pods' ingress labels

        podingress_labels.remove(podingress_labels.path_for("/run", self.node))
        # What a reconciler opened on this node namespace with the default roots recorded for status
        # (report/edt_refused.py): per namespace, so it names only this bed's devices; never left behind.
        from shaperd.engine import refusals_file as edt_refused

        edt_refused.path_for("/run", self.node).unlink(missing_ok=True)
        from shaperd.backends.htb import podlabels  # the capped pods' labels, likewise (backends/htb/podlabels.py)

        podlabels.path_for("/run", self.node).unlink(missing_ok=True)


@pytest.fixture
def bed(request):
    tag = f"shpd{os.getpid() % 100000}{abs(hash(request.node.name)) % 1000}"
    b = Bed(tag)
    try:
        yield b.build()
    finally:
        b.cleanup()


def wait_for(pred, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    return pred()


def mount_bpffs(path: Path) -> None:
    """A private bpffs at *path* (never the host's /sys/fs/bpf)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(path)], check=True, timeout=30, capture_output=True)


def umount_bpffs(path: Path) -> None:
    """Unmount (every pin under it goes; attached programs live on through their filters)."""
    subprocess.run(["umount", str(path)], check=False, timeout=30, capture_output=True)
    try:
        path.rmdir()
    except OSError:
        pass


@pytest.fixture(scope="session", autouse=True)
def private_bpffs_for_cli(tmp_path_factory):
    """Every `shaperd` these tests start pins under a private bpffs (SHAPERD_BPFFS_ROOT, the
    --bpffs-root default), so no test writes to the host's /sys/fs/bpf."""
    if os.geteuid() != 0:
        yield None
        return
    path = tmp_path_factory.mktemp("session-bpffs") / "fs"
    try:
        mount_bpffs(path)
    except (subprocess.CalledProcessError, OSError):
        os.environ["SHAPERD_BPFFS_ROOT"] = ""  # no bpffs here: adoption by id, as before pins
        yield None
        os.environ.pop("SHAPERD_BPFFS_ROOT", None)
        return
    os.environ["SHAPERD_BPFFS_ROOT"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("SHAPERD_BPFFS_ROOT", None)
        umount_bpffs(path)


@pytest.fixture
def pinfs(tmp_path):
    """A private bpffs mount for one test, unmounted in cleanup even when the test fails."""
    path = tmp_path / "bpffs"
    mount_bpffs(path)
    try:
        yield path
    finally:
        umount_bpffs(path)
