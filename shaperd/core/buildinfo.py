"""What this build of shaperd is: version, git commit, build time, Python, pyroute2.

The commit comes from ``shaperd/_build.json`` (written at build time by
``scripts/stamp-build``), else, for a run from a git checkout (an editable
install), from ``git rev-parse`` with a deadline; otherwise it is unknown
(None), never made up. Read by ``shaperd --version`` (cli_meta.py) and the
``shaperd_build_info`` metric.

Must not: touch the kernel or the network.
"""

from __future__ import annotations

import functools
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from shaperd import __version__

BUILD_FILE = Path(__file__).with_name("_build.json")
GIT_DEADLINE_S = 2.0


def _git_commit(where: Path) -> str | None:
    """HEAD of the checkout holding ``where`` (an editable install), or None; never more than GIT_DEADLINE_S."""
    if not (where.parent / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(where.parent), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=GIT_DEADLINE_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def build_info(build_file: Path = BUILD_FILE) -> dict[str, str | None]:
    """{version, commit, built, python, pyroute2}; commit/built None when not known."""
    stamped: dict = {}
    try:
        stamped = json.loads(build_file.read_text())
    except (OSError, ValueError):
        pass
    commit = stamped.get("commit") or _git_commit(Path(__file__).resolve().parent)
    try:
        pyroute2 = metadata.version("pyroute2")
    except metadata.PackageNotFoundError:
        pyroute2 = None
    return {"version": __version__, "commit": commit, "built": stamped.get("built"),
            "python": f"{platform.python_implementation()} {platform.python_version()}", "pyroute2": pyroute2}


@functools.lru_cache(maxsize=1)
def cached() -> dict[str, str | None]:
    """build_info() of this process, computed once (git runs at most once per process)."""
    return build_info()
