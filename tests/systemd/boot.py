"""Build a Debian 12 tree, install shaperd and its unit in it, and boot it once under systemd-nspawn.

The recipe is TESTGROUND.md's "A real systemd as PID 1": debootstrap bookworm minbase, shaperd
from a wheelhouse made on the host (offline install in the tree), systemd/shaperd.service
copied to /etc/systemd/system as scripts/install-baremetal installs it, a bpffs mounted for this
session only and bound in, and test units around shaperd.service: a veth before it, the
capability report outside the sandbox before it, the collector (container/collect.py) after it,
which powers the container off. Every command has a deadline and runs in its own process group,
killed by its id when the deadline passes; ``Tree.remove`` unmounts and deletes everything.

SHAPERD_SYSTEMD_BASE=DIR reuses a debootstrapped tree (copied, never changed) to save the ~4 min
debootstrap when iterating, SHAPERD_SYSTEMD_KEEP_OUT=DIR keeps a copy of what the container
recorded; CI leaves both unset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests import procs

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PACKAGES = "systemd,systemd-sysv,iproute2,python3,python3-venv,dbus"
DEBOOTSTRAP_DEADLINE_S = 1200.0
BOOT_DEADLINE_S = 420.0  # the collector powers off by itself well before (its own steps have deadlines)
TOOLS = ("debootstrap", "systemd-nspawn", "mount", "umount")

TENANTS = """\
node:
  interfaces: [sd0]
  capacity: 1Gbps
tenants:
  - name: tenant-a
    bandwidthGuarantee: 100Mbps
    bandwidthLimit: 300Mbps
    priority: 100
    match:
      cidrs: [198.18.0.0/25]
  - name: tenant-b
    bandwidthGuarantee: 50Mbps
    bandwidthLimit: 200Mbps
    priority: 50
    match:
      cidrs: [198.18.0.128/25]
"""

VETH_UNIT = """\
[Unit]
Description=test: a veth for shaperd to shape (tests/systemd)
Before=shaperd.service shaperd-test-caps.service
DefaultDependencies=no
After=systemd-networkd.service

[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=30
ExecStart=/usr/sbin/ip link add sd0 type veth peer name sd1
ExecStart=/usr/sbin/ip addr add 198.18.0.1/24 dev sd0
ExecStart=/usr/sbin/ip link set sd0 up
ExecStart=/usr/sbin/ip link set sd1 up

[Install]
RequiredBy=shaperd.service
"""

# Outside the sandbox: root with the unit's two capabilities, none of its filters or Protect*=.
CAPS_UNIT = """\
[Unit]
Description=test: shaperd's capability report outside its unit's sandbox (tests/systemd)
After=shaperd-test-veth.service
Before=shaperd.service

[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=60
CapabilityBoundingSet=CAP_NET_ADMIN CAP_BPF
AmbientCapabilities=CAP_NET_ADMIN CAP_BPF
ExecStart=/bin/sh -c '/opt/shaperd/bin/python /usr/local/lib/shaperd-test/capreport.py /etc/shaperd/traffic-shaping.yaml > /out/caps-outside.json'

[Install]
WantedBy=shaperd.service
"""

COLLECT_UNIT = """\
[Unit]
Description=test: record shaperd under systemd, then power off (tests/systemd)
After=shaperd.service

[Service]
Type=oneshot
TimeoutStartSec=360
ExecStart=/usr/bin/python3 /usr/local/lib/shaperd-test/collect.py
# The collector powers off itself; if it is killed at its deadline, this still does.
ExecStopPost=/bin/systemctl --no-block poweroff

[Install]
WantedBy=multi-user.target
"""


class SetupError(RuntimeError):
    pass


def check_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise SetupError(f"missing {', '.join(missing)} (scripts/setup installs debootstrap and systemd-container)")


def sh(argv: list[str], timeout_s: float = 120.0, what: str = "") -> subprocess.CompletedProcess:
    try:
        r = procs.run(argv, timeout_s=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SetupError(f"{what or argv[0]}: no answer within {timeout_s:.0f} s (its process group was killed)")
    if r.returncode != 0:
        raise SetupError(f"{what or ' '.join(argv)[:200]}: exit {r.returncode}: {(r.stderr or r.stdout)[-3000:]}")
    return r


@dataclass
class Boot:
    rc: int | None
    seconds: float
    console: str


class Tree:
    """A temporary directory holding the tree (root/), the results (out/) and the bpffs (bpf/)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shaperd-systemd-", dir="/var/tmp"))
        self.root, self.out, self.bpf = self.dir / "root", self.dir / "out", self.dir / "bpf"
        self.out.mkdir()
        self.bpf.mkdir()
        self.mounted = False
        self.timings: dict[str, float] = {}

    def _timed(self, name: str, fn, *a) -> None:
        t0 = time.monotonic()
        fn(*a)
        self.timings[name] = round(time.monotonic() - t0, 1)

    def build(self, unit: Path) -> None:
        self._timed("tree", self._tree)
        self._timed("install", self._install, unit)
        sh(["mount", "-t", "bpf", "bpf", str(self.bpf)], what=f"mount a bpffs on {self.bpf}")
        self.mounted = True

    def _tree(self) -> None:
        base = os.environ.get("SHAPERD_SYSTEMD_BASE")
        if base:
            sh(["cp", "-a", base, str(self.root)], timeout_s=300, what=f"copy the tree {base}")
        else:
            sh(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", str(self.root)],
               timeout_s=DEBOOTSTRAP_DEADLINE_S, what="debootstrap bookworm")

    def _install(self, unit: Path) -> None:
        wh = self.root / "wh"
        sh([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", str(ROOT), "-w", str(wh)],
           timeout_s=600, what="pip wheel shaperd into a wheelhouse")
        sh(["chroot", str(self.root), "python3", "-m", "venv", "/opt/shaperd"], what="python3 -m venv in the tree")
        sh(["chroot", str(self.root), "/opt/shaperd/bin/pip", "install", "-q", "--disable-pip-version-check",
            "--no-index", "--find-links", "/wh", "shaperd"], timeout_s=600, what="offline pip install in the tree")
        shutil.rmtree(wh)
        # As scripts/install-baremetal installs it: the unit file unchanged, the tenants file beside it.
        units = self.root / "etc" / "systemd" / "system"
        shutil.copyfile(unit, units / "shaperd.service")
        (self.root / "etc" / "shaperd").mkdir(parents=True, exist_ok=True)
        (self.root / "etc" / "shaperd" / "traffic-shaping.yaml").write_text(TENANTS)
        lib = self.root / "usr" / "local" / "lib" / "shaperd-test"
        lib.mkdir(parents=True, exist_ok=True)
        for f in ("capreport.py", "collect.py"):
            shutil.copyfile(HERE / "container" / f, lib / f)
        for name, text in (("shaperd-test-veth.service", VETH_UNIT), ("shaperd-test-caps.service", CAPS_UNIT),
                           ("shaperd-test-collect.service", COLLECT_UNIT)):
            (units / name).write_text(text)
        for name in ("shaperd.service", "shaperd-test-veth.service", "shaperd-test-caps.service",
                     "shaperd-test-collect.service"):
            sh(["systemctl", f"--root={self.root}", "enable", name], what=f"systemctl enable {name} in the tree")
        # No getty on the container's console: the boot's output is systemd's and shaperd's only.
        sh(["systemctl", f"--root={self.root}", "mask", "console-getty.service"], what="mask console-getty")

    def boot(self) -> Boot:
        argv = ["systemd-nspawn", "-q", "--register=no", "--keep-unit", "-D", str(self.root), "-b",
                "--private-network", f"--bind={self.out}:/out", f"--bind={self.bpf}:/sys/fs/bpf",
                "--capability=CAP_NET_ADMIN,CAP_BPF", "--system-call-filter=bpf"]
        t0 = time.monotonic()
        p = procs.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            console, _ = p.communicate(timeout=BOOT_DEADLINE_S)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            procs.kill(p)
            console, rc = (p.stdout.read() if p.stdout else ""), None
        secs = round(time.monotonic() - t0, 1)
        self.timings["boot"] = secs
        return Boot(rc, secs, console or "")

    def remove(self) -> None:
        keep = os.environ.get("SHAPERD_SYSTEMD_KEEP_OUT")  # a place to copy the recorded results to, when debugging
        if keep:
            shutil.copytree(self.out, keep, dirs_exist_ok=True)
        if self.mounted:
            procs.run(["umount", str(self.bpf)], timeout_s=60, check=False)
            self.mounted = False
        # Nothing else is mounted in the tree: nspawn's mounts live and die in its own namespace.
        for d in (self.root / "proc", self.root / "sys", self.root / "dev"):
            if os.path.ismount(d):
                procs.run(["umount", "-l", str(d)], timeout_s=60, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
