"""The layers, as a test: every import points down, no backend imports another, and nothing is circular.

Bottom up: core (config, model, units, inventory, tenancy, errors, the protocol's types), kernel
(generic netlink, bpf, probes), discovery, rdma (the shared RDMA model), backends (one folder each;
shared rules in backends/common), engine, report, webhook, daemon, cli. Every import counts,
those inside functions included: they hide a cycle from import time, not from a reader. The root
package (``shaperd/__init__.py``, the version only) is below everything; nothing else may sit at the
root but ``__main__``.

Run as a script on another checkout to list its offending edges:
``python tests/unit/test_layers.py /path/to/checkout``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

RANK = {"core": 0, "kernel": 1, "discovery": 2, "rdma": 3, "backends": 4, "engine": 5, "report": 6,
        "webhook": 7, "daemon": 8, "cli": 9}
ROOT_OK = {"shaperd", "shaperd.__main__"}


def module_name(path: Path, pkg: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph(pkg: Path) -> dict[str, set[str]]:
    """module -> the shaperd modules it imports (anywhere in its body), relative imports resolved."""
    files = {module_name(p, pkg): p for p in pkg.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for mod, path in files.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)
        deps = set()
        for n in names:
            while n and n not in files:
                n = n.rpartition(".")[0]
            if n and n != mod:
                deps.add(n)
        out[mod] = deps
    return out


def layer(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else None


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod in sorted(g):
        if layer(mod) is None and mod not in ROOT_OK:
            bad.append(f"{mod}: a loose module at the package root (it belongs to a layer)")
        for dep in sorted(g[mod]):
            lm, ld = layer(mod), layer(dep)
            if dep == "shaperd" or lm is None or ld is None:
                continue
            if RANK[ld] > RANK[lm]:
                bad.append(f"{mod} -> {dep}: {lm} may not import {ld}")
            elif lm == ld == "backends":
                bm, bd = mod.split(".")[2:3], dep.split(".")[2:3]
                if bm and bd and bm != bd and bd != ["common"]:
                    bad.append(f"{mod} -> {dep}: no backend imports another (shared rules go in backends/common)")
                if bm == ["common"] and bd and bd != ["common"]:
                    bad.append(f"{mod} -> {dep}: backends/common imports no backend")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


PKG = Path(__file__).resolve().parents[2] / "shaperd"


def test_the_scan_sees_every_module_and_the_edges_that_cross_layers():
    # Guard against a vacuous pass: the graph has the modules, and edges across layers to check.
    g = graph(PKG)
    assert len(g) > 150 and {"shaperd.kernel.tc", "shaperd.engine.registry", "shaperd.cli.main"} <= set(g)
    assert "shaperd.kernel.tc" in g["shaperd.backends.htb.kernel_tc"]
    assert any(layer(d) == "backends" for d in g["shaperd.engine.registry"])
    # An import inside a function counts: the rule would see one that points up.
    assert "shaperd.backends.htb.backend" in g["shaperd.backends.htb.spec"]


def test_the_rules_bite_on_a_tree_that_breaks_them():
    g = {"shaperd.kernel.tc": {"shaperd.backends.htb.ops"}, "shaperd.backends.edt.plan": {"shaperd.backends.htb.plan"},
         "shaperd.report.status": {"shaperd.cli.main"}, "shaperd.cli_old": set(),
         "shaperd.core.a": {"shaperd.core.b"}, "shaperd.core.b": {"shaperd.core.a"}}
    got = violations(g)
    assert len(got) == 4 and any("kernel may not import backends" in v for v in got)
    assert any("no backend imports another" in v for v in got) and any("loose module" in v for v in got)
    assert cycles(g) == [["shaperd.core.a", "shaperd.core.b"]]


def test_every_import_points_down_and_no_backend_imports_another():
    assert violations(graph(PKG)) == []


def test_no_import_cycles_not_even_through_function_level_imports():
    assert cycles(graph(PKG)) == []


if __name__ == "__main__":
    root = Path(sys.argv[1]) / "shaperd" if len(sys.argv) > 1 else PKG
    g = graph(root)
    found = violations(g)
    print("\n".join(found))
    for c in cycles(g):
        print("cycle:", " <-> ".join(c))
    print(f"{len(found)} offending edges or loose modules, {len(cycles(g))} cycles")
