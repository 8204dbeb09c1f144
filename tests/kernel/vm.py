"""Boot Debian's kernel under QEMU with virtme-ng, the host's filesystem shared, and run one command in it.

The real-kernel tier needs what this machine's kernel lacks (ib_core,
rdma_rxe). ``boot`` runs ``vng --disable-kvm`` (KVM does not boot here:
TESTGROUND.md) in its own process group with a hard deadline: on timeout
the whole group (vng, virtme-run, qemu) is killed by its group id. The
guest writes its results into a host directory shared read-write.

Re-record the RDMA netlink fixtures of the unit tests (as root, after
``scripts/setup``)::

    .venv/bin/python -m tests.kernel.vm --record tests/unit/fixtures/rdma_nl
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GuestProgram:
    """One program of the tier's single boot: ``python -m MODULE OUTDIR`` in the guest writes OUTDIR/RESULT."""

    name: str  # its key in the merged result (the probe's is the result itself)
    module: str
    result: str  # the JSON file it writes into OUTDIR
    deadline_s: float  # on a quiet machine; the guest runner multiplies it by the calibrated factor


# Every guest program of the tier, run in this order by tests/kernel/guest_main.py in one boot.
# Adding one is one line here; its tests read ``guest.result[NAME]`` (tests/kernel/conftest.py).
GUEST_PROGRAMS: tuple[GuestProgram, ...] = (
    GuestProgram("probe", "tests.kernel.guest_probe", "result.json", 240.0),  # rxe, RDMA netlink, rdma status
    GuestProgram("edt", "tests.kernel.edt_guest", "edt.json", 480.0),  # edt data plane, isolation, status
    GuestProgram("netdevsim", "tests.kernel.netdevsim_guest", "netdevsim.json", 300.0),  # devlink, vfrate
)
RUNNER_JSON = "runner.json"  # the runner's calibration and progress (tests/kernel/guest_main.py)
# The outer deadline of one boot, on the host. The guest's own deadlines scale with its measured speed
# (up to guest_speed.MAX_FACTOR); this one cannot be calibrated before the guest runs, so it is generous:
# a quiet boot of the whole tier takes minutes (BENCHMARKS.md "QEMU tier"); 80 min is still inside
# CI's 90. When it is hit, the failure names the program the guest was running (runner.json).
BOOT_DEADLINE_S = 4800.0


class VmUnavailable(Exception):
    """What the tier needs is not installed (qemu, a kernel image, busybox, virtme-ng)."""


@dataclass(frozen=True)
class GuestRun:
    rc: int | None  # None: killed at the deadline
    output: str
    seconds: float
    kernel: str
    group_gone: bool  # nothing of the guest's process group (vng, qemu) outlived the run


def kernel_image() -> Path:
    """The newest Debian kernel image under /boot (``-amd64``: linux-image-amd64's, not the host's own)."""
    images = sorted(Path("/boot").glob("vmlinuz-*-amd64"), key=lambda p: p.stat().st_mtime)
    if not images:
        raise VmUnavailable("no kernel image under /boot (apt-get install linux-image-amd64; scripts/setup does)")
    return images[-1]


def vng_binary() -> Path:
    vng = Path(sys.executable).parent / "vng"
    if not vng.exists():
        raise VmUnavailable(f"{vng} missing (pip install virtme-ng into .venv; scripts/setup does)")
    return vng


def check_tools() -> tuple[Path, Path]:
    missing = [t for t in ("qemu-system-x86_64", "busybox") if shutil.which(t) is None]
    if missing:
        raise VmUnavailable(f"{', '.join(missing)} not installed (apt-get install qemu-system-x86 busybox-static; "
                            "scripts/setup does)")
    return vng_binary(), kernel_image()


def precompile(timeout_s: float = 600.0) -> None:
    """Write the bytecode of shaperd, the tests and the venv's packages on the host, before a boot.

    The guest sees the host's tree read-only, so it cannot cache bytecode: without this every
    Python process in it compiles every module it imports, under TCG (~15x slower than here).
    That compile was most of ``shaperd status``'s minute in the guest (BENCHMARKS.md "status
    cost"). compileall skips what is up to date; -f is not used, so a warm tree costs ~1 s.
    """
    import sysconfig

    dirs = [ROOT / "shaperd", ROOT / "tests", ROOT / "bench", Path(sysconfig.get_paths()["purelib"])]
    argv = [sys.executable, "-m", "compileall", "-q", "-j", "0", *(str(d) for d in dirs if d.is_dir())]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    try:
        proc.wait(timeout=timeout_s)  # a file it cannot compile is the guest's to report, not this step's
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def boot(guest_argv: list[str], rwdirs: list[Path], deadline_s: float = BOOT_DEADLINE_S) -> GuestRun:
    """Run ``guest_argv`` as root in a fresh guest; the guest's console output comes back as text."""
    vng, image = check_tools()
    precompile()
    # vng --exec takes one string for the guest's shell: built here only from our own paths, each quoted.
    argv = [str(vng), "--disable-kvm", "--run", str(image), "--user", "root", "--cpus", "2", "--memory", "2G"]
    for d in rwdirs:
        argv += ["--rwdir", str(d)]
    argv += ["--exec", f"cd {shlex.quote(str(ROOT))} && {shlex.join(guest_argv)}"]
    env = dict(os.environ, PATH=f"{vng.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    start = time.monotonic()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group (qemu), also on success
            except ProcessLookupError:
                pass
            proc.wait()
        seconds = time.monotonic() - start
        log.seek(0)
        output = log.read().decode(errors="replace")
    return GuestRun(rc, output, seconds, image.name.removeprefix("vmlinuz-"), _group_gone(proc.pid))


def _group_gone(pgid: int, deadline_s: float = 10.0) -> bool:
    """True once no process of the group is left (SIGKILLed processes need a moment to be reaped)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)  # polling a condition with a deadline, not synchronising on time


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def progress(outdir: Path) -> str:
    """How far the guest runner got: calibration, the programs done, the one it was running."""
    doc = _read(outdir / RUNNER_JSON)
    if doc is None:
        return "the guest runner never started (no runner.json: the boot itself or the first import hung)"
    cal = doc.get("calibration") or {}
    return (f"guest at {doc.get('elapsed_s')} s: {doc.get('now')}; done: {', '.join(doc.get('done', [])) or 'none'}; "
            f"speed factor {cal.get('factor', 'not yet measured')}")


def probe(outdir: Path) -> tuple[GuestRun, dict | None]:
    """Boot once and run every program of GUEST_PROGRAMS (tests/kernel/guest_main.py); the merged result:
    the probe's result.json, each other program's JSON under its name (None if it wrote none), the runner's
    ``programs`` (rc, seconds, output tail) and ``calibration``. None if the probe wrote nothing."""
    run = boot([sys.executable, "-m", "tests.kernel.guest_main", str(outdir)], [outdir])
    result = _read(outdir / GUEST_PROGRAMS[0].result)
    if result is None:
        return run, None
    runner = _read(outdir / RUNNER_JSON) or {}
    result["programs"], result["calibration"] = runner.get("programs", {}), runner.get("calibration")
    for prog in GUEST_PROGRAMS[1:]:
        result[prog.name] = _read(outdir / prog.result)
        result["steps"][prog.name] = result["programs"].get(prog.name, {"rc": None, "stderr": "did not run"})
    return run, result


FIXTURES = {  # fixture file -> (probe step, what of it)
    "rdma_dev_show.strace": ("strace_dev", "stderr"), "rdma_dev_show.json": ("rdma_dev", "stdout"),
    "rdma_link_show.strace": ("strace_link", "stderr"), "rdma_link_show.json": ("rdma_link", "stdout"),
    "rdma_stat_show.strace": ("strace_stat", "stderr"), "rdma_stat_show.json": ("rdma_stat", "stdout"),
    "rdma_sys_show.strace": ("strace_sys", "stderr"), "rdma_sys_show.txt": ("rdma_sys", "stdout"),
    "rdma_dev_show_empty.strace": ("strace_empty_dump", "stderr"),
}


def record(dest: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="shaperd-vm-") as tmp:
        run, result = probe(Path(tmp))
    if result is None:
        print(run.output[-4000:], file=sys.stderr)
        print(f"the guest wrote no result (rc {run.rc}, {run.seconds:.0f} s)", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    for name, (step, part) in FIXTURES.items():
        (dest / name).write_text(result["steps"][step][part])
    sysfs = {"uname": result["uname"], "sysfs": result.get("sysfs"), "counters": result.get("counters"),
             "veth_ifindex": result.get("veth_ifindex")}
    (dest / "sysfs_rxe.json").write_text(json.dumps(sysfs, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(FIXTURES) + 1} files into {dest} from kernel {result['uname']} in {run.seconds:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, required=True, metavar="DIR", help="write the RDMA netlink fixtures here")
    args = ap.parse_args(argv)
    return record(args.record)


if __name__ == "__main__":
    sys.exit(main())
