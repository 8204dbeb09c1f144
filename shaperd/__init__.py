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
