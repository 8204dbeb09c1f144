"""The layering, as a test: who may speak netlink, open devices, or do I/O at all.

- Only shaperd/kernel/ imports pyroute2 or ctypes, opens netlink sockets or
  names device files. The HTTP endpoint's listening socket (report/http.py)
  is the named exception (the test bed is a separate package, testbed/).
- The planning and diffing modules (the backends' objects, ops, plan, diff,
  render, ids, tenancy, base) are pure: they import nothing that does I/O
  and call no open().
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "shaperd"
MODULES = sorted(p for p in PKG.rglob("*.py"))
KERNEL = PKG / "kernel"
# http.py: the metrics listener; sdnotify.py: the datagram to systemd ($NOTIFY_SOCKET, AF_UNIX).
# A backend's own kernel side: its modules named kernel.py or kernel_*.py.
BACKEND_KERNEL = {p for p in (PKG / "backends").rglob("kernel*.py")}
SOCKET_EXCEPTIONS = {PKG / "report" / "http.py", PKG / "report" / "sdnotify.py"}
PURE = sorted(
    [p for p in (PKG / "backends").rglob("*.py")
     if p.stem in ("base", "objects", "ops", "plan", "diff", "render", "ids", "__init__")]
    + [PKG / "core" / n for n in ("tenancy.py", "inventory.py", "roots.py", "units.py", "protocol.py", "ids.py")]
    + [PKG / "rdma" / "nccl.py", PKG / "backends" / "nccl" / "envfiles.py"]
    + [PKG / "webhook" / "admission.py"]
)
IO_MODULES = {"os", "socket", "subprocess", "pathlib", "io", "shutil", "select", "ctypes", "pyroute2", "urllib",
              "http", "kubernetes", "psutil", "threading"}
IO_PACKAGES = ("shaperd.kernel", "shaperd.discovery", "shaperd.report", "shaperd.engine")


def imports(tree: ast.AST, path: Path) -> set[str]:
    """Absolute dotted names of everything a module imports (relative imports resolved)."""
    pkg = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def parsed(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def test_the_scan_sees_the_kernel_side_and_the_pure_modules():
    # Guard against a vacuous pass: the rules below must have something to bite on.
    kernel_imports = set().union(*(imports(parsed(p), p) for p in KERNEL.glob("*.py")))
    assert "pyroute2" in {n.split(".")[0] for n in kernel_imports} and "ctypes" in kernel_imports
    assert len(PURE) >= 15 and all(p.exists() for p in PURE)


@pytest.mark.parametrize("path", [p for p in MODULES if KERNEL not in p.parents and p not in BACKEND_KERNEL], ids=lambda p: str(p.relative_to(PKG)))
def test_only_the_kernel_side_speaks_netlink_or_opens_devices(path):
    tree = parsed(path)
    roots = {n.split(".")[0] for n in imports(tree, path)}
    assert not roots & {"pyroute2", "ctypes"}, f"{path.name} imports {roots & {'pyroute2', 'ctypes'}}"
    src = path.read_text()
    assert "AF_NETLINK" not in src
    if path not in SOCKET_EXCEPTIONS:
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "socket" and isinstance(n.func.value, ast.Name) and n.func.value.id == "socket"]
        assert not calls, f"{path.name} opens a socket"
    devices = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value.startswith("/dev/")]
    assert not devices, f"{path.name} names device files {devices}"


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(PKG)))
def test_plan_and_diff_modules_do_no_io(path):
    tree = parsed(path)
    names = imports(tree, path)
    bad = {n for n in names if n.split(".")[0] in IO_MODULES or n.startswith(IO_PACKAGES)}
    if path.name == "roots.py":
        bad -= {"pathlib", "pathlib.Path"}  # it joins paths; it never opens one
    if path == PKG / "backends" / "htb" / "objects.py":
        bad -= {"ipaddress"}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"
    opens = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "open"]
    assert not opens, f"{path.name} calls open()"
