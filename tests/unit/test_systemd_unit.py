"""systemd/shaperd.service: a Type=notify unit that systemd accepts, hardened to exposure <= 2.0,
and scripts/install-baremetal puts the command its ExecStart names where it points.

The install test builds a real venv (pip, from the configured index) into a temporary tree:
the same script an operator runs, with --prefix/--unit-dir/--config-dir, and then
``systemd-analyze verify`` of the unit it wrote (which checks that ExecStart is executable).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shaperd.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "shaperd.service"
MAX_EXPOSURE = 2.0
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze missing (Debian package systemd; scripts/setup installs it)")


def run(argv, timeout_s=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, start_new_session=True, **kw)


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_notify_watchdog_reload_and_restart_on_failure():
    s = settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"] and int(s["WatchdogSec"][0]) >= 10
    assert s["ExecReload"] == ["/bin/sh -c 'kill -HUP ${MAINPID}'"] and s["Restart"] == ["on-failure"]
    argv = s["ExecStart"][0].split()
    assert argv[0] == "/opt/shaperd/bin/shaperd"  # where scripts/install-baremetal puts it
    assert build_parser().parse_args(argv[1:]).cmd == "run"
    assert "CAP_SYS_ADMIN" not in s["CapabilityBoundingSet"][0]


@needs_analyze
def test_exposure_is_at_most_2():
    r = run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)])
    m = re.search(r"Overall exposure level for shaperd\.service: (\d+\.\d)", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, r.stdout


@pytest.mark.slow  # 8-35 s (--durations, quiet)
@needs_analyze
def test_installed_into_a_temporary_tree_the_unit_verifies_and_its_command_runs(tmp_path):
    prefix, units, conf = tmp_path / "opt" / "shaperd", tmp_path / "units", tmp_path / "etc" / "shaperd"
    args = ["bash", str(ROOT / "scripts" / "install-baremetal"), "--prefix", str(prefix), "--unit-dir", str(units),
            "--config-dir", str(conf), "--no-systemctl"]
    # The host's python3, as an operator's shell would find it (not this test's venv).
    r = run(args, timeout_s=600, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(Path.home())})
    assert r.returncode == 0, r.stderr[-3000:]
    unit = (units / "shaperd.service").read_text()
    exec_start = next(l for l in unit.splitlines() if l.startswith("ExecStart=")).split("=", 1)[1].split()
    assert exec_start[0] == str(prefix / "bin" / "shaperd")
    assert exec_start[exec_start.index("--config") + 1] == str(conf / "traffic-shaping.yaml")
    # The installed command validates the tenants file it installed.
    ok = run([exec_start[0], "check-config", str(conf / "traffic-shaping.yaml")])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    v = run(["systemd-analyze", "verify", "--man=no", str(units / "shaperd.service")])
    problems = [l for l in (v.stdout + v.stderr).splitlines() if "shaperd.service" in l]
    assert v.returncode == 0 and not problems, v.stdout + v.stderr
    # The pages Documentation= names were installed with it, and so are the docs the README links.
    docs = next(l for l in unit.splitlines() if l.startswith("Documentation=")).split("=", 1)[1].split()
    assert docs and all(u.startswith("file://") and Path(u[len("file://"):]).is_file() for u in docs), docs
    for page in ("operations.md", "configuration.md", "design.md"):
        assert (prefix / "share" / "doc" / "shaperd" / "docs" / page).is_file(), page
    # A re-run is an upgrade: the old venv is kept for --rollback, the tenants file is not touched.
    (conf / "traffic-shaping.yaml").write_text((conf / "traffic-shaping.yaml").read_text() + "# mine\n")
    r = run(args, timeout_s=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (prefix.parent / "shaperd.previous" / "bin" / "shaperd").exists()
    assert (conf / "traffic-shaping.yaml").read_text().endswith("# mine\n")
    r = run(["bash", str(ROOT / "scripts" / "install-baremetal"), "--prefix", str(prefix), "--rollback"])
    assert r.returncode == 0 and run([str(prefix / "bin" / "shaperd"), "--version"]).returncode == 0, r.stderr


def test_the_shipped_unit_fails_verify_when_its_command_is_missing_so_the_check_bites(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze missing")
    bad = tmp_path / "shaperd.service"
    bad.write_text(UNIT.read_text().replace("/opt/shaperd/bin/shaperd", str(tmp_path / "nope" / "shaperd")))
    v = run(["systemd-analyze", "verify", "--man=no", str(bad)])
    assert v.returncode != 0 and "is not executable" in v.stdout + v.stderr


# ---- the seccomp filter, evaluated as systemd does (issue 22: ~@privileged took bpf away) ----------

def _group(name: str, seen: dict[str, set[str]]) -> set[str]:
    """The syscalls of @name, nested groups expanded (systemd-analyze syscall-filter's listing)."""
    if name not in seen:
        r = run(["systemd-analyze", "syscall-filter", "--no-pager", name])
        assert r.returncode == 0, f"systemd-analyze syscall-filter {name}: {r.stderr}"
        seen[name] = set()
        for line in r.stdout.splitlines()[1:]:
            item = line.strip()
            if not item or item.startswith("#"):
                continue
            seen[name] |= _group(item, seen) if item.startswith("@") else {item}
    return seen[name]


def allowed_syscalls(lines: list[str]) -> set[str]:
    """The allow list SystemCallFilter= lines leave, in order: the first line picks allow-list mode (systemd
    then adds @default), a later '~' line removes its names, a later plain line adds them again."""
    seen: dict[str, set[str]] = {}
    expand = lambda words: set().union(*(_group(w, seen) if w.startswith("@") else {w} for w in words))  # noqa: E731
    assert lines and not lines[0].startswith("~"), "the unit's filter must start with an allow list"
    allowed = expand(["@default"])
    for line in lines:
        if line.startswith("~"):
            allowed -= expand(line[1:].split())
        else:
            allowed |= expand(line.split())
    return allowed


@needs_analyze
def test_the_units_syscall_filter_in_order_keeps_bpf_and_prlimit64_allowed():
    allowed = allowed_syscalls(settings()["SystemCallFilter"])
    # bpf: the classifier, marks and edt programs and maps; prlimit64: RLIMIT_MEMLOCK on kernels < 5.11
    # (shaperd/kernel/bpf.py raise_memlock); the rest: what its sandbox would otherwise take, spot-checked.
    for call in ("bpf", "prlimit64", "sendmsg", "recvmsg", "socket", "bind", "setsockopt", "clone3"):
        assert call in allowed, f"SystemCallFilter= lines leave {call} denied"
    for call in ("setrlimit", "init_module", "reboot", "mount", "ptrace", "setuid", "chroot"):
        assert call not in allowed, f"SystemCallFilter= lines allow {call}"


@needs_analyze
def test_the_filter_evaluation_catches_the_shipped_0_1_0_filter_that_took_bpf_away():
    old = ["@system-service @network-io bpf",
           "~@privileged @resources @obsolete @debug @cpu-emulation @swap @reboot @raw-io @module @clock"]
    assert "bpf" not in allowed_syscalls(old)
    assert "bpf" in allowed_syscalls(old + ["bpf"])
