"""Import pyroute2's submodules without its package ``__init__``, which imports every pyroute2 API.

``import pyroute2`` (and so any ``pyroute2.netlink...`` import) runs pyroute2/__init__.py, which imports
NDB (and sqlite3), IPDB, plan9, conntrack, ipset, ipvs, nl80211, wireguard, ethtool and the rest: 309
modules and 22.7 MiB of RSS in a fresh interpreter (pyroute2 0.9.7). shaperd uses the netlink message
classes and the rtnl constants (IPRoute only in test helpers: the agent's own writes and reads go through
kernel/nlwriter.py and kernel/rtnl.py). ``install`` puts a module for the package in sys.modules that
has the real package's spec and path but has not run its ``__init__``, so ``pyroute2.netlink.*`` and
``pyroute2.iproute`` import as usual and nothing else does: the daemon's imports take 6.6 MiB and 80
modules fewer (40.8 -> 34.2 MiB, 511 -> 431 modules, fresh interpreter). The first read of a
top-level name that is not a submodule (``pyroute2.NDB``, ``from pyroute2 import X`` in a test or a
plugin) runs the real ``__init__`` into that module, so code that wants the whole package still
gets it. shaperd's own code imports from the submodules (``from pyroute2.netlink.rtnl import ...``).

Called from shaperd/__init__.py, before any module of shaperd imports pyroute2. Does nothing when
pyroute2 is already imported or not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys


def install() -> bool:
    """True when the lean package module is in place (now or from an earlier call)."""
    mod = sys.modules.get("pyroute2")
    if mod is not None:
        return getattr(mod, "__shaperd_lean__", False)
    try:
        spec = importlib.util.find_spec("pyroute2")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    mod = importlib.util.module_from_spec(spec)  # __path__, __spec__, __file__ set; __init__ not run

    def __getattr__(name: str):  # noqa: N807 - PEP 562 module hook
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"pyroute2.{name}") is not None:  # "from pyroute2 import config": a submodule
            return importlib.import_module(f"pyroute2.{name}")
        del mod.__getattr__  # once: the real __init__ defines the names from here on
        mod.__shaperd_lean__ = False
        spec.loader.exec_module(mod)
        return getattr(mod, name)

    mod.__getattr__ = __getattr__
    mod.__shaperd_lean__ = True
    sys.modules["pyroute2"] = mod
    return True
