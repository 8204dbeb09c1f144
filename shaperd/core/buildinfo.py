"""What this build of shaperd is: version, git commit, build time, Python, pyroute2.

The version comes from the git tag: the build (setuptools-scm, pyproject.toml
``[tool.setuptools_scm]``) writes it, with the commit it was built from, into
``shaperd/_version.json``; a wheel, an sdist and the image carry that file.
The commit, in this order: ``shaperd/_build.json`` (an explicit stamp by
``scripts/stamp-build``, e.g. CI naming its own commit); in a git checkout
(an editable install: the directory above the package holds ``.git``),
``git rev-parse`` with a deadline, since the checkout moves on after install;
the commit in ``_version.json``; otherwise unknown (None), never made up. Read
by ``shaperd --version`` (cli/meta.py) and the ``shaperd_build_info`` metric.

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

PACKAGE_DIR = Path(__file__).resolve().parent.parent
BUILD_FILE = PACKAGE_DIR / "_build.json"
VERSION_FILE = PACKAGE_DIR / "_version.json"
GIT_DEADLINE_S = 2.0
SHORT = 12


def _short(commit: object) -> str | None:
    """A commit id as 12 hex digits; setuptools-scm's node is 'g' + the full id."""
    if not isinstance(commit, str):
        return None
    c = commit.strip().lower()
    if c.startswith("g"):
        c = c[1:]
    if len(c) < 7 or any(ch not in "0123456789abcdef" for ch in c):
        return None
    return c[:SHORT]


def _git_commit(package_dir: Path) -> str | None:
    """HEAD of the checkout holding the package directory (an editable install), or None.

    The checkout's root is the package directory's parent (``<root>/shaperd``); ``.git`` is a
    directory in a clone and a file in a worktree. Never more than GIT_DEADLINE_S.
    """
    root = package_dir.parent
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", f"--short={SHORT}", "HEAD"],
                           capture_output=True, text=True, timeout=GIT_DEADLINE_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return _short(r.stdout) if r.returncode == 0 else None


def _built_commit() -> str | None:
    """The commit the build wrote into shaperd/_version.json, or None (not built by setuptools-scm)."""
    try:
        return _short(json.loads(VERSION_FILE.read_text()).get("commit"))
    except (OSError, ValueError, AttributeError):
        return None


def build_info(build_file: Path = BUILD_FILE, package_dir: Path = PACKAGE_DIR,
               built_commit=_built_commit, version: str = __version__) -> dict[str, str | None]:
    """{version, commit, built, python, pyroute2}; commit/built None when not known."""
    stamped: dict = {}
    try:
        stamped = json.loads(build_file.read_text())
    except (OSError, ValueError):
        pass
    commit = _short(stamped.get("commit")) or _git_commit(package_dir) or built_commit()
    try:
        pyroute2 = metadata.version("pyroute2")
    except metadata.PackageNotFoundError:
        pyroute2 = None
    return {"version": version, "commit": commit, "built": stamped.get("built"),
            "python": f"{platform.python_implementation()} {platform.python_version()}", "pyroute2": pyroute2}


@functools.lru_cache(maxsize=1)
def cached() -> dict[str, str | None]:
    """build_info() of this process, computed once (git runs at most once per process)."""
    return build_info()
