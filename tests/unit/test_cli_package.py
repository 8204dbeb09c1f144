"""The command line is a package of command groups, and the pieces every command shares exist once.

- every module of shaperd/cli/ says what it owns (a docstring), and every group main.py lists adds its
  commands through one ``register(subparsers)``; build_parser does nothing else;
- no module of the package imports cli/main (the root would import itself back: a cycle);
- the exit codes and the "shaperd: ..." printer are defined in core/exitcodes.py only.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from pathlib import Path

import pytest

from shaperd.cli import main as cli

PKG = Path(__file__).resolve().parents[2] / "shaperd"
CLI_MODULES = sorted((PKG / "cli").glob("*.py"))


@pytest.mark.parametrize("path", CLI_MODULES, ids=lambda p: p.name)
def test_every_cli_module_says_what_it_owns(path):
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"


def test_each_group_registers_its_own_commands_through_one_function():
    seen: dict[str, str] = {}
    for group in cli.GROUPS:
        sub = argparse.ArgumentParser().add_subparsers()
        group.register(sub)
        assert sub.choices, f"{group.__name__} registers no command"
        for name in sub.choices:
            assert name not in seen, f"{name} registered by {seen[name]} and {group.__name__}"
            seen[name] = group.__name__
    root = cli.build_parser()
    (action,) = [a for a in root._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(action.choices) == set(seen)  # build_parser adds no command of its own
    body = inspect.getsource(cli.build_parser)
    assert "add_parser" not in body and "group.register(sub)" in body


@pytest.mark.parametrize("path", CLI_MODULES, ids=lambda p: p.name)
def test_no_cli_module_imports_the_root_back(path):
    if path.name == "main.py":
        return
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
                 if isinstance(node, ast.ImportFrom) else [])
        assert not any(n == "shaperd.cli.main" for n in names), f"{path.name} imports shaperd.cli.main"


def _definitions():
    """(module, what) for every EXIT_* constant assigned and every literal 'shaperd: ' print in the package."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name) and n.id.startswith("EXIT_"):
                            out.append((rel, n.id))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                for a in node.args:
                    first = a.values[0] if isinstance(a, ast.JoinedStr) and a.values else a
                    if isinstance(first, ast.Constant) and str(first.value).startswith("shaperd: "):
                        out.append((rel, "print('shaperd: ...')"))
    return out


def test_exit_codes_and_the_error_printer_exist_once():
    found = _definitions()
    assert {m for m, _ in found} == {"core/exitcodes.py"}, [f for f in found if f[0] != "core/exitcodes.py"]
    assert sorted(w for _, w in found) == sorted(["EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_DIFF_PENDING",
                                                  "EXIT_DIFF_ERROR", "EXIT_INTERRUPTED", "print('shaperd: ...')"])


def _modules_after(code: str) -> set[str]:
    import sys

    from tests import procs
    out = procs.run([sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sys.modules))"], timeout_s=120).stdout
    return set(out.split())


def test_a_command_line_that_names_no_rdma_command_does_not_build_the_rdma_tree():
    """The rdma tree lists every backend's subcommands, so building it imports the engine and every backend:
    `shaperd apply` and `status` must not pay for it. A command line that names rdma (or completion,
    which prints the whole tree) gets all of it."""
    lean = _modules_after("from shaperd.cli.main import build_parser\nbuild_parser(['check-config', 'x.yaml'])")
    assert "shaperd.engine.registry" not in lean and "shaperd.cli.rdma_opensm" not in lean
    whole = _modules_after("from shaperd.cli.main import build_parser\nbuild_parser(['--log-json', 'rdma', 'env'])")
    assert {"shaperd.engine.registry", "shaperd.cli.rdma_opensm"} <= whole
    stub = cli.build_parser(["status"])
    full = cli.build_parser(None)
    helps = [{a.dest: a.help for a in next(x for x in p._actions if isinstance(x, argparse._SubParsersAction))
              ._choices_actions} for p in (stub, full)]
    assert helps[0] == helps[1]  # `shaperd --help` reads the same either way
    assert full.parse_args(["rdma", "status"]).rdma_cmd == "status"
