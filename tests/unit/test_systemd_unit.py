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
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"] and s["Restart"] == ["on-failure"]
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
