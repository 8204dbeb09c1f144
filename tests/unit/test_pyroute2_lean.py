"""kernel/pyroute2_lean.py: shaperd imports pyroute2's submodules without the package __init__ (which
imports every pyroute2 API), and a caller that reads a top-level name still gets the whole package."""

from __future__ import annotations

import sys

from tests import procs


def _run(code: str) -> str:
    return procs.run([sys.executable, "-c", code], timeout_s=120).stdout.strip()


def test_shaperd_kernel_side_loads_no_pyroute2_api_it_does_not_use():
    out = _run("import sys\nimport shaperd.kernel.tc, shaperd.kernel.probe, shaperd.engine.registry\n"
               "print(sys.modules['pyroute2'].__shaperd_lean__, 'pyroute2.ndb' in sys.modules, 'sqlite3' in sys.modules,"
               " 'pyroute2.ipdb' in sys.modules)")
    assert out == "True False False False"


def test_a_top_level_name_loads_the_whole_package_once():
    out = _run("import shaperd.kernel.tc\nimport pyroute2\nfrom pyroute2 import NDB, IPRoute\n"
               "import pyroute2.iproute, sys\n"
               "print(IPRoute is pyroute2.iproute.IPRoute, 'pyroute2.ndb' in sys.modules, pyroute2.__shaperd_lean__,"
               " bool(pyroute2.__version__))")
    assert out == "True True False True"


def test_a_pyroute2_imported_first_is_left_as_it_is():
    out = _run("import pyroute2, sys\nimport shaperd.kernel.tc\nfrom shaperd.kernel import pyroute2_lean\n"
               "print(pyroute2_lean.install(), 'pyroute2.ndb' in sys.modules)")
    assert out == "False True"
