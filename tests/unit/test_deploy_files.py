"""The shipped deployment files parse and agree with the CLI."""

from pathlib import Path

from shaperd.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


# The DaemonSet and its overlays: tests/unit/test_kustomize.py.


def test_systemd_unit_runs_a_valid_command():
    unit = (ROOT / "systemd" / "shaperd.service").read_text()
    line = next(l for l in unit.splitlines() if l.startswith("ExecStart="))
    argv = line.split("=", 1)[1].split()
    assert argv[0].endswith("/shaperd")
    assert build_parser().parse_args(argv[1:]).cmd == "run"
    assert "ExecReload=/bin/sh -c 'kill -HUP ${MAINPID}'" in unit
