"""A simulated InfiniBand fabric for tests: ibsim, OpenSM under ibsim-run, and smpquery; every step with a deadline.

``Fabric(tmp_path).start()`` writes a small netfile (2 switches, 3 HCAs) and
starts ``ibsim -n -s NETFILE`` in its own process group; ``close()`` kills
every process group it started, so a failing test leaves nothing behind.
ibsim's clients (umad2sim, LD_PRELOADed by ibsim-run) reach it through
abstract unix sockets named after IBSIM_SOCKNAME ("<name>:ctl",
"<name>:in<pid>"): each Fabric sets its own name, so fabrics never collide,
and IBSIM_SERVER_NAME/IBSIM_SERVER_PORT are removed from the environment, so
nothing uses inet sockets. OpenSM's cache and temporary files (OSM_CACHE_DIR,
OSM_TMP_DIR) and its log go under the test's directory.
"""

from __future__ import annotations

import pytest

import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("ibsim", "ibsim-run", "opensm", "smpquery", "ibnetdiscover")

NETFILE = """\
# shaperd test fabric: the first port listed is the SM's (Switch1 port 0).
Switch\t8 "Switch1"
[1]\t"Hca1"[1]
[2]\t"Hca2"[1]
[3]\t"Switch2"[3]

Switch\t8 "Switch2"
[1]\t"Hca3"[1]
[3]\t"Switch1"[3]

Hca\t1 "Hca1"
[1]\t"Switch1"[1]

Hca\t1 "Hca2"
[1]\t"Switch1"[2]

Hca\t1 "Hca3"
[1]\t"Switch2"[1]
"""

_counter = itertools.count()


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


def wait_for(condition, deadline_s: float, what: str, interval_s: float = 0.2):
    """Poll until condition() is truthy; its value, or AssertionError naming what did not happen."""
    end = time.monotonic() + deadline_s
    last = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s:g} s")
        time.sleep(interval_s)


def run_group(argv: list[str], timeout_s: float = 60.0, **kw) -> subprocess.CompletedProcess:
    """Run a command in its own process group; at the deadline the group is killed and AssertionError raised."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _killpg(p)
        out, err = p.communicate()
        raise AssertionError(f"{' '.join(argv)}: no result within {timeout_s:g} s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


@dataclass(frozen=True)
class FabricPort:
    kind: str  # "CA" or "SW"
    lid: int
    port: int
    name: str  # the netfile's node id: "Hca1", "Switch1"
    peer: str | None = None


class Fabric:
    def __init__(self, tmp: Path, netfile: str = NETFILE):
        self.dir = Path(tmp)
        self.netfile_text = netfile
        self.sockname = f"shaperd-t{os.getpid()}-{next(_counter)}"
        self.groups: list[subprocess.Popen] = []
        self.ibsim: subprocess.Popen | None = None
        self.ibsim_log = self.dir / "ibsim.log"

    # ------------------------------------------------------------ processes

    def env(self, sim_host: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("IBSIM_SERVER_NAME", "IBSIM_SERVER_PORT", "SIM_HOST", "LD_PRELOAD")}
        env.update(IBSIM_SOCKNAME=self.sockname, OSM_CACHE_DIR=str(self.dir), OSM_TMP_DIR=str(self.dir))
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        if sim_host:
            env["SIM_HOST"] = sim_host
        return env

    def spawn(self, argv: list[str], log: Path, sim_host: str | None = None) -> subprocess.Popen:
        with open(log, "ab") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 cwd=self.dir, env=self.env(sim_host), start_new_session=True)
        self.groups.append(p)
        return p

    def start(self, deadline_s: float = 30.0) -> "Fabric":
        net = self.dir / "fabric.net"
        net.write_text(self.netfile_text)
        self.ibsim = self.spawn(["ibsim", "-n", "-s", str(net)], self.ibsim_log)

        def ready():
            if self.ibsim.poll() is not None:
                raise AssertionError(f"ibsim exited ({self.ibsim.returncode}):\n{self.ibsim_log.read_text()}")
            return "Network simulator ready" in self.ibsim_log.read_text(errors="replace") and \
                f"@{self.sockname}:ctl" in Path("/proc/net/unix").read_text(errors="replace")

        wait_for(ready, deadline_s, "ibsim ready")
        return self

    def run(self, *argv: str, sim_host: str | None = None, timeout_s: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
        """One tool under ibsim-run, in its own process group, killed by group at the deadline."""
        cp = run_group(["ibsim-run", *argv], timeout_s, cwd=self.dir, env=self.env(sim_host))
        if check and cp.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
        return cp

    def opensm_once(self, opts: Path, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """One sweep (-o) with this options file: discovers, assigns LIDs, programs QoS, exits."""
        return self.run("opensm", "-F", str(Path(opts).resolve()), "-e", "-f", str(self.dir / "osm.log"),
                        "-s", "0", "-o", timeout_s=timeout_s)

    def start_opensm(self, opts: Path) -> subprocess.Popen:
        """A running opensm (no sweeping of its own: -s 0); SIGHUP makes it re-read opts and sweep."""
        return self.spawn(["ibsim-run", "opensm", "-F", str(Path(opts).resolve()), "-e",
                           "-f", str(self.dir / "osm.log"), "-s", "0"], self.dir / "opensm.out")

    def close(self) -> None:
        for p in reversed(self.groups):
            _killpg(p)
        for p in self.groups:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.groups.clear()

    # ------------------------------------------------------------ reading the fabric

    def ports(self) -> list[FabricPort]:
        """Linked ports and their LIDs, from ``ibnetdiscover -p``."""
        cp = self.run("ibnetdiscover", "-p", check=False)
        if cp.returncode != 0:
            return []  # not discoverable yet (no SM has swept)
        out = cp.stdout
        rows = []
        for line in out.splitlines():
            m = re.match(r"^(CA|SW)\s+(\d+)\s+(\d+)\s+0x[0-9a-f]+\s+\S+\s+\S+\s+-\s+(CA|SW)\s+\d+\s+\d+\s+"
                         r"0x[0-9a-f]+\s+\(\s*'([^']*)'\s+-\s+'([^']*)'\s*\)", line)
            if m:
                rows.append(FabricPort(m[1], int(m[2]), int(m[3]), m[5], m[6]))
        return rows

    def smpquery(self, *args: str, sim_host: str | None = None) -> str:
        return self.run("smpquery", *args, sim_host=sim_host, timeout_s=30).stdout


def _killpg(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# The marks of every test module that runs OpenSM on ibsim.
IBSIM_MARKS = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: scripts/setup installs ibsim-utils, opensm and "
                                                 "infiniband-diags as root, and these tests run OpenSM on ibsim"),
]
