"""smpquery's SL2VL and VLArb output, parsed from real captures, and the runner's deadline and errors.

fixtures/smpquery/ holds smpquery's stdout from OpenSM on ibsim, programmed
with opensm.conf (rendered from tenants.yaml there). Re-record as root:
``.venv/bin/python -m tests.ibsim_capture tests/unit/fixtures/smpquery``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shaperd.core import config
from shaperd.rdma import opensm
from shaperd.rdma import smcheck
from shaperd.rdma.plan import plan
from shaperd.core.inventory import Inventory
from shaperd.kernel import ib_smp
from shaperd.core.tenancy import tenancy

from ..ibsim import wait_for

FIX = Path(__file__).parent / "fixtures" / "smpquery"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def rendered() -> opensm.OpenSmConfig:
    cfg = config.load_file(FIX / "tenants.yaml")
    inv = Inventory()
    return opensm.render(cfg, plan(cfg, inv, tenancy(cfg, inv)), {"default": 8, "ca": 4})


def test_the_fixtures_were_recorded_with_the_current_rendering():
    assert fixture("opensm.conf") == rendered().text()


@pytest.mark.parametrize("name", ["sl2vl_ca.txt", "sl2vl_self.txt"])
def test_sl2vl_of_an_hca_port(name):
    (row,) = ib_smp.parse_sl2vl(fixture(name))
    assert (row.in_port, row.out_port) == (0, 0)
    assert row.vls == rendered().tables("ca").sl2vl == (0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3)


def test_sl2vl_of_a_switch_port_has_a_row_per_in_port():
    rows = ib_smp.parse_sl2vl(fixture("sl2vl_switch.txt"))
    assert [(r.in_port, r.out_port) for r in rows] == [(i, 3) for i in range(9)]
    assert {r.vls for r in rows} == {rendered().tables("swe").sl2vl}


@pytest.mark.parametrize("name,port_type,port", [("vlarb_ca.txt", "ca", 1), ("vlarb_self.txt", "ca", 1),
                                                 ("vlarb_switch.txt", "swe", 3)])
def test_vlarb_tables(name, port_type, port):
    arb = ib_smp.parse_vlarb(fixture(name))
    want = rendered().tables(port_type)
    assert (arb.port, arb.low_cap, arb.high_cap) == (port, 8, 8)
    assert arb.low == smcheck.port_entries(want.vlarb_low, 8)
    assert arb.high == smcheck.port_entries(want.vlarb_high, 8) == ((0, 64),) + ((0, 0),) * 7
    if port_type == "ca":
        assert arb.low[:3] == ((1, 255), (2, 128), (3, 77))  # 0xFF, 0x80, 0x4D as smpquery prints them


def test_a_base_switch_port_0_has_no_vlarb():
    assert ib_smp.parse_vlarb(fixture("vlarb_switch_port0.txt")) is None


@pytest.mark.parametrize("text,problem", [
    ("", "no 'ports: in N, out M:' row"),
    ("ports: in  0, out  0: | 0| 1|\n", "line 1: expected 16 VLs"),
    ("ports: in  0, out  0: | 0| x|" + " 0|" * 14 + "\n", "line 1: expected VL numbers"),
])
def test_bad_sl2vl_output(text, problem):
    with pytest.raises(ib_smp.SmpParseError, match=problem):
        ib_smp.parse_sl2vl(text)


def test_bad_vlarb_output():
    with pytest.raises(ib_smp.SmpParseError, match="no '# VLArbitration tables"):
        ib_smp.parse_vlarb("# Low priority VL Arbitration Table:\n")
    short = fixture("vlarb_ca.txt").replace("LowCap 8", "LowCap 16")
    with pytest.raises(ib_smp.SmpParseError, match="low table: 8 VLs and 8 weights for a capacity of 16"):
        ib_smp.parse_vlarb(short)


# ---------------------------------------------------------------- the runner, against a stand-in smpquery


def fake_smpquery(tmp_path: Path, body: str) -> dict[str, str]:
    """An executable named smpquery first on PATH; the env to pass."""
    exe = tmp_path / "bin" / "smpquery"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{exe.parent}:{os.environ.get('PATH', '')}"}


def test_read_port_passes_an_argument_list_and_parses(tmp_path):
    log = tmp_path / "argv"
    env = fake_smpquery(tmp_path, f"""echo "$@" >> {log}
case "$*" in
  *sl2vl*) cat {FIX / 'sl2vl_self.txt'} ;;
  *vlarb*) cat {FIX / 'vlarb_self.txt'} ;;
esac
""")
    t = ib_smp.read_port("mlx5_1", 1, env=env)
    assert log.read_text().splitlines() == ["-C mlx5_1 -P 1 -D sl2vl 0", "-C mlx5_1 -P 1 -D vlarb 0 1"]
    assert t.sl2vl == rendered().tables("ca").sl2vl and t.vlarb.low_cap == 8


def test_a_hung_smpquery_is_killed_with_its_group_at_the_deadline(tmp_path):
    pid_file = tmp_path / "child"
    env = fake_smpquery(tmp_path, f"sleep 600 & echo $! > {pid_file}; wait\n")
    with pytest.raises(ib_smp.SmpError, match=r"smpquery -D sl2vl 0 on mlx5_1:1: no answer within 1 s"):
        ib_smp.read_port("mlx5_1", 1, timeout_s=1, env=env)
    if pid_file.exists() and pid_file.read_text().strip():  # else it was killed before it forked
        child = Path(f"/proc/{int(pid_file.read_text())}")
        # The sleep was in smpquery's process group, so it went with it (reaped by init, or a zombie until then).
        wait_for(lambda: not child.exists() or "State:\tZ" in _status(child), 30, "the stand-in's child killed")


def _status(proc: Path) -> str:
    try:
        return (proc / "status").read_text()
    except OSError:
        return "State:\tZ (gone)"


def test_failures_say_why(tmp_path):
    env = fake_smpquery(tmp_path, "echo 'ibwarn: noise' >&2; echo \"smpquery: iberror: failed: Failed to open "
                                  "'mlx5_9' port '1'\" >&2; exit 255\n")
    with pytest.raises(ib_smp.SmpError, match=r"exit status 255: smpquery: iberror: failed: Failed to open 'mlx5_9'"):
        ib_smp.read_port("mlx5_9", 1, env=env)
    env = fake_smpquery(tmp_path, "echo garbage\n")
    with pytest.raises(ib_smp.SmpError, match="unexpected output: no 'ports: in N, out M:' row"):
        ib_smp.read_port("mlx5_1", 1, env=env)
    with pytest.raises(ib_smp.SmpError, match=r"not found \(install infiniband-diags\)"):
        ib_smp.read_port("mlx5_1", 1, env={"PATH": str(tmp_path / "nowhere")})
