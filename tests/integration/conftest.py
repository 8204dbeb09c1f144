"""Namespaces for integration tests: made per test, removed even when the test fails.

Every address is from 198.18.0.0/15 or 2001:db8::/32; traffic never leaves
namespaces the tests create.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


class Bed:
    """A node namespace with an uplink veth to a peer namespace (and optional pods)."""

    def __init__(self, tag: str):
        self.tag = tag
        self.node = f"{tag}-node"
        self.peer = f"{tag}-peer"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []

    def ns(self, name: str) -> str:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        for key in ("all", "default"):
            run("ip", "netns", "exec", name, "sysctl", "-qw", f"net.ipv6.conf.{key}.accept_dad=0")
        run("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def build(self) -> "Bed":
        self.ns(self.node)
        self.ns(self.peer)
        run("ip", "-n", self.node, "link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", self.peer)
        self.addr(self.node, "up0", "198.18.0.1/24", "198.18.1.1/24", "198.18.2.1/24", "198.18.3.1/24",
                  "2001:db8:1::1/64")
        self.addr(self.peer, "up1", "198.18.0.2/24", "2001:db8:1::2/64")
        run("ip", "-n", self.node, "link", "set", "up0", "up")
        run("ip", "-n", self.peer, "link", "set", "up1", "up")
        run("ip", "-n", self.node, "route", "add", "default", "via", "198.18.0.2")
        # Static neighbours: no ARP/ND chatter in the counters.
        peer_mac = json.loads(run("ip", "-n", self.peer, "-j", "link", "show", "up1").stdout)[0]["address"]
        run("ip", "-n", self.node, "neigh", "replace", "198.18.0.2", "lladdr", peer_mac, "dev", "up0", "nud", "permanent")
        run("ip", "-n", self.node, "neigh", "replace", "2001:db8:1::2", "lladdr", peer_mac, "dev", "up0", "nud", "permanent")
        return self

    def addr(self, ns: str, dev: str, *cidrs: str) -> None:
        for c in cidrs:
            run("ip", "-n", ns, "addr", "add", c, "dev", dev, *(["nodad"] if ":" in c else []))

    def exec(self, *argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        return run("ip", "netns", "exec", ns or self.node, *argv, check=check)

    def shaperd(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return self.exec(PY, "-m", "shaperd", "--log-json", *args, check=check)

    def start_daemon(self, config: Path, *extra: str) -> subprocess.Popen:
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.node, PY, "-m", "shaperd", "--log-json", "run", "--config", str(config), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.procs.append(p)
        return p

    def send(self, src: str, dst: str, size: int, count: int, ns: str | None = None) -> None:
        self.exec(PY, "-c", SENDER, src, dst, str(size), str(count), ns=ns)

    def tc_json(self, *what: str) -> list:
        return json.loads(self.exec("tc", "-j", "-s", *what).stdout or "[]")

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)
        for ns in reversed(self.namespaces):
            run("ip", "netns", "pids", ns, check=False)
            for pid in run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            run("ip", "netns", "del", ns, check=False)


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
