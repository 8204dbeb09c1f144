"""shaperd: per-tenant egress bandwidth enforcement for multi-tenant GPU nodes."""


def _version() -> str:
    # Written by the build from the git tag (pyproject.toml [tool.setuptools_scm]); else the
    # installed distribution's metadata; else a version that says it is not known.
    import json
    from pathlib import Path

    try:
        return str(json.loads(Path(__file__).with_name("_version.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from importlib import metadata
    try:
        return metadata.version("shaperd")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


__version__ = _version()


def _lean_pyroute2() -> None:
    # Before any shaperd module imports pyroute2: its submodules without its package __init__, which
    # imports every pyroute2 API (kernel/pyroute2_lean.py says what that saves).
    from shaperd.kernel import pyroute2_lean

    pyroute2_lean.install()


_lean_pyroute2()
