"""The subnet-manager modules keep the layering: rendering, file editing and the check are pure; only the kernel side
runs smpquery, and nothing but opensm_host signals a process.

The same rules as test_import_contract, applied to modules whose names that test does not list.
"""

from __future__ import annotations

import ast

import pytest

from .test_import_contract import IO_MODULES, IO_PACKAGES, PKG, imports, parsed

PURE = [PKG / "rdma" / n for n in ("opensm.py", "opensm_file.py", "smcheck.py")]


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_pure(path):
    tree = parsed(path)
    bad = {n for n in imports(tree, path) if n.split(".")[0] in IO_MODULES or n.startswith(IO_PACKAGES)}
    assert not bad, f"{path.name} imports {sorted(bad)}"
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id == "open"]


def test_only_the_kernel_side_runs_smpquery_and_only_opensm_host_signals():
    runs, signals = set(), set()
    for path in PKG.rglob("*.py"):
        names = imports(parsed(path), path)
        src = path.read_text()
        if '"smpquery"' in src and "subprocess" in names:
            runs.add(path.relative_to(PKG).as_posix())
        if "send_signal" in src or "os.kill(" in src:
            signals.add(path.relative_to(PKG).as_posix())
    assert runs == {"kernel/ib_smp.py"}
    assert "rdma/opensm_host.py" in signals
    assert not {s for s in signals - {"rdma/opensm_host.py"} if "rdma" in s or s.startswith("kernel/ib")}
