"""``shaperd rdma opensm-config``: print, --write (atomic, only shaperd's keys) and SIGHUP to the right opensm.

The opensm processes here are stand-ins (a shell script named opensm that
logs each SIGHUP), so this runs without root; the real OpenSM is in
tests/integration/test_opensm.py.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import structlog

from shaperd.cli import main as cli
from shaperd.rdma import opensm
from shaperd.rdma.opensm_host import DEFAULT_OPENSM_CONFIG, config_of

from ..ibsim import wait_for

TENANTS = """
node: {capacity: 100Gbps, reserve: 1Gbps}
tenants:
  - {name: tenant-a, bandwidthGuarantee: 40Gbps, priority: 100}
  - {name: tenant-b, bandwidthGuarantee: 20Gbps, priority: 50}
"""
GENERATED = Path(__file__).parent / "fixtures" / "opensm" / "opensm-3.3.23.conf"


@pytest.fixture(autouse=True)
def _keep_logging():
    """cli.main configures structlog onto this test's captured stderr; put the previous set-up back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.parametrize("argv,cwd,want", [
    (["opensm"], "/", DEFAULT_OPENSM_CONFIG),
    (["/usr/sbin/opensm", "-F", "/etc/o.conf"], "/", "/etc/o.conf"),
    (["opensm", "-F/etc/o.conf", "-e"], "/", "/etc/o.conf"),
    (["opensm", "--config", "o.conf"], "/srv", "/srv/o.conf"),
    (["opensm", "--config=/etc/o.conf"], "/", "/etc/o.conf"),
    (["opensm", "-eF", "/etc/o.conf"], "/", "/etc/o.conf"),  # grouped short options
    (["opensm", "-f", "-F", "-s", "0"], "/", DEFAULT_OPENSM_CONFIG),  # "-F" here is the log file's name
    (["/bin/sh", "/opt/opensm", "-F", "/etc/o.conf"], "/", "/etc/o.conf"),  # a script: argv[0] is the shell
])
def test_which_options_file_an_opensm_reads(argv, cwd, want):
    assert config_of(argv, cwd) == os.path.realpath(want)


@pytest.fixture
def tenants(tmp_path):
    p = tmp_path / "tenants.yaml"
    p.write_text(TENANTS)
    return p


def test_prints_the_block(tenants, capsys):
    assert cli.main(["rdma", "opensm-config", "--config", str(tenants)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(opensm.BEGIN_MARK) and "qos_sl2vl 0,1,2,2,2,2,2,2,2,2,2,2,2,2,2,2\n" in out


def test_bad_arguments_and_a_bad_tenants_file_exit_2(tenants, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["rdma", "opensm-config", "--config", str(tenants), "--max-vls", "rtr=4"])
    assert e.value.code == 2 and "unknown port type 'rtr'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - {name: a, bandwidthGuarantee: 1Gbps, rdma: {serviceLevel: 15}}\n")
    assert cli.main(["rdma", "opensm-config", "--config", str(bad)]) == 2
    assert "tenants[0].rdma.serviceLevel: expected an InfiniBand service level 0-14" in capsys.readouterr().err


def test_write_is_atomic_keeps_mode_follows_symlinks_and_leaves_no_temp_file(tenants, tmp_path, capsys):
    real = tmp_path / "etc" / "opensm.conf"
    real.parent.mkdir()
    real.write_bytes(GENERATED.read_bytes())
    real.chmod(0o600)
    link = tmp_path / "opensm.conf"
    link.symlink_to(real)
    assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(link), "--no-signal"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {real}: added shaperd's QoS block; removed 21 qos line(s)" in out
    assert "kept 644 other line(s) unchanged" in out and "opensm not signalled (--no-signal)" in out
    assert link.is_symlink() and stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(p.name for p in real.parent.iterdir()) == ["opensm.conf"]
    assert "qos TRUE\n" in real.read_text() and "\nqos FALSE\n" not in real.read_text()


def test_a_new_file_is_created(tenants, tmp_path, capsys):
    target = tmp_path / "new.conf"
    assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target)]) == 0
    assert f"wrote {target}: created it with the QoS block" in capsys.readouterr().out
    assert target.read_text().startswith(opensm.BEGIN_MARK)


class StandIn:
    """A process named opensm reading -F CONF that logs each SIGHUP; killed by process group."""

    def __init__(self, tmp: Path, name: str, conf: Path):
        exe = tmp / name / "opensm"
        exe.parent.mkdir()
        exe.write_text('#!/bin/sh\ntrap \'echo hup >> "$HUP_LOG"\' HUP\necho ready > "$HUP_LOG.ready"\n'
                       'while :; do sleep 600 & wait $!; done\n')
        exe.chmod(0o755)
        self.log = tmp / f"{name}.hup"
        self.proc = subprocess.Popen([str(exe), "-F", str(conf), "-e"], start_new_session=True,
                                     env={**os.environ, "HUP_LOG": str(self.log)}, stdin=subprocess.DEVNULL)
        wait_for(lambda: Path(f"{self.log}.ready").exists(), 30, f"stand-in {name} ready")

    def hups(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def test_sighup_goes_to_the_opensm_reading_the_file_only(tenants, tmp_path, capsys):
    target, other = tmp_path / "opensm.conf", tmp_path / "other.conf"
    target.write_text("sweep_interval 10\n")
    mine = theirs = None
    try:
        mine = StandIn(tmp_path, "mine", target)
        theirs = StandIn(tmp_path, "theirs", other)
        assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target)]) == 0
        out = capsys.readouterr().out
        assert f"sent SIGHUP to opensm pid {mine.proc.pid}: it re-reads {target}" in out
        assert f"opensm pid {theirs.proc.pid} reads {other}, not this file: not signalled" in out
        wait_for(lambda: mine.hups() == 1, 30, "the SIGHUP")
        assert theirs.hups() == 0 and mine.proc.poll() is None

        # Unchanged: no write, no signal.
        assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target)]) == 0
        assert "already as rendered; not written, opensm not signalled" in capsys.readouterr().out

        # A pid file: that opensm, even though it reads another file (with a warning).
        pid_file = tmp_path / "opensm.pid"
        pid_file.write_text(f"{theirs.proc.pid}\n")
        target.write_text("sweep_interval 10\n")
        assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target),
                         "--opensm-pid-file", str(pid_file)]) == 0
        cap = capsys.readouterr()
        assert f"sent SIGHUP to opensm pid {theirs.proc.pid}" in cap.out and f"reads {other}, not {target}" in cap.err
        wait_for(lambda: theirs.hups() == 1, 30, "the SIGHUP through the pid file")
        assert mine.hups() == 1
    finally:
        for s in (mine, theirs):
            if s is not None:
                s.close()


def test_a_pid_file_naming_something_else_is_refused(tenants, tmp_path, capsys):
    pid_file = tmp_path / "opensm.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # this test's python, not an opensm
    target = tmp_path / "opensm.conf"
    assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target),
                     "--opensm-pid-file", str(pid_file)]) == 1
    err = capsys.readouterr().err
    assert f"names pid {os.getpid()}, which is" in err and "not opensm; not signalled" in err
    pid_file.write_text("nonsense")
    target.write_text("")
    assert cli.main(["rdma", "opensm-config", "--config", str(tenants), "--write", str(target),
                     "--opensm-pid-file", str(pid_file)]) == 1
    assert "expected a process id, got 'nonsense'" in capsys.readouterr().err
