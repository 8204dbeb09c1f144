"""The test bed is its own distribution: the agent's CLI finds it when installed and says how to
install it when not (no root needed)."""
import builtins
import sys

import pytest

from shaperd.cli import demo as cli_demo
from shaperd.cli import main as cli


def test_demo_takes_the_beds_options_when_installed():
    args = cli.build_parser().parse_args(["demo", "--duration", "1.5", "--modes", "none"])
    assert args.fn is cli_demo.cmd_demo and args.duration == 1.5 and args.modes == "none"


@pytest.fixture
def no_bed(monkeypatch):
    """Import as on a node where only the agent is installed."""
    real_import = builtins.__import__

    def fake_import(name, *a, **kw):
        if name == "shaperd_bed" or name.startswith("shaperd_bed."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="shaperd_bed")
        return real_import(name, *a, **kw)

    for mod in [m for m in sys.modules if m == "shaperd_bed" or m.startswith("shaperd_bed.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", fake_import)


@pytest.mark.parametrize("argv", [["demo"], ["demo", "--duration", "3", "--json"], ["demo", "--help"]])
def test_demo_without_the_bed_exits_2_saying_how_to_install(no_bed, capsys, argv):
    args = cli.build_parser().parse_args(argv)  # not cli.main: it configures logging for the process
    assert args.fn(args) == 2
    err = capsys.readouterr().err
    assert "pip install ./testbed" in err


def test_the_agent_does_not_import_the_bed_for_other_commands(no_bed):
    assert cli.build_parser().parse_args(["plan", "--config", "x.yaml"]).cmd == "plan"


def test_agent_distribution_and_image_leave_the_bed_out():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    agent = tomllib.loads((root / "pyproject.toml").read_text())
    include = agent["tool"]["setuptools"]["packages"]["find"]["include"]
    assert include == ["shaperd", "shaperd.*"]  # "shaperd*" would also match shaperd_bed
    bed = tomllib.loads((root / "testbed" / "pyproject.toml").read_text())
    assert bed["project"]["name"] == "shaperd-testbed" and "shaperd" in bed["project"]["dependencies"]
    assert not (root / "shaperd" / "bed").exists()
    # The image build copies a wheelhouse of the agent and its dependencies only (a COPY of "."
    # would put the bed in a layer); scripts/build-image makes it from "." (the agent's
    # distribution, which leaves the bed out) and pip, never from ./testbed.
    copied = set()
    for line in (root / "Containerfile").read_text().splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            copied.update(line.split()[1:-1])
    assert copied == {"build/wheelhouse", "LICENSE"}
    wheel = next(l for l in (root / "scripts" / "build-image").read_text().splitlines() if " pip wheel " in l)
    assert "-w build/wheelhouse . pip" in wheel and "testbed" not in wheel
