"""The version comes from the git tag (pyproject.toml [tool.setuptools_scm]) and names its commit.

Each test makes its own git repository in tmp_path (tags only there, never in this checkout)
and runs this checkout's real pyproject.toml through setuptools-scm, or builds a wheel from a
copy of the package, without build isolation and without an index (so offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shaperd.cli import meta as cli_meta
from shaperd.core import buildinfo

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

pytest.importorskip("setuptools_scm")
if shutil.which("git") is None:
    pytest.skip("git is not installed", allow_module_level=True)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=GIT_ENV, timeout=DEADLINE_S).stdout.strip()


def scm_version(repo: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "setuptools_scm"], cwd=repo, capture_output=True, text=True,
                       env=GIT_ENV, timeout=DEADLINE_S, check=True)
    return r.stdout.strip().splitlines()[-1]


def new_repo(tmp_path: Path, commit: bool = True) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    if commit:
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "pyproject.toml")
        git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_tagged_commit_is_the_tag_and_later_commits_are_dev_versions_of_the_next(tmp_path):
    repo = new_repo(tmp_path)
    git(repo, "tag", "v0.1.0")
    assert scm_version(repo) == "0.1.0"
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    git(repo, "commit", "-q", "--allow-empty", "-m", "third")
    head = git(repo, "rev-parse", "HEAD")
    # PEP 440: a dev release of the next patch, counting commits since the tag, naming the commit
    assert scm_version(repo) == f"0.1.1.dev2+g{head[:9]}"
    git(repo, "tag", "0.2.0")  # a tag without the v prefix counts as well
    assert scm_version(repo) == "0.2.0"


def test_without_a_tag_the_version_says_unknown_and_is_never_a_fixed_one(tmp_path):
    repo = new_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    v = scm_version(repo)
    assert v == f"0.0.1.dev1+unknown.g{head[:9]}"
    assert not v.startswith("0.1.0")


def test_without_git_metadata_the_fallback_is_0_0_0_unknown(tmp_path):
    assert scm_version(new_repo(tmp_path, commit=False)) == "0.0.0+unknown"


def test_pyproject_takes_the_version_from_the_tag_not_a_fixed_one():
    import tomllib

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in conf["project"] and "version" in conf["project"]["dynamic"]
    assert any(r.startswith("setuptools-scm") for r in conf["build-system"]["requires"])
    assert conf["tool"]["setuptools_scm"]["version_file"] == "shaperd/_version.json"
    assert "version = " not in (ROOT / "shaperd" / "__init__.py").read_text().replace("__version__ = _version()", "")


def tagged_copy(tmp_path: Path, tag: str) -> tuple[Path, str]:
    """A git repository of this checkout's package files, committed and tagged; (its path, HEAD)."""
    repo = new_repo(tmp_path, commit=False)
    for name in ("README.md", "LICENSE"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "shaperd", repo / "shaperd",
                    ignore=shutil.ignore_patterns("__pycache__", "_version.json", "_build.json"))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "release")
    git(repo, "tag", tag)
    return repo, git(repo, "rev-parse", "HEAD")


def build_wheel(src: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True, env=GIT_ENV, timeout=DEADLINE_S)
    (wheel,) = out.glob("shaperd-*.whl")
    return wheel


def version_of_wheel(wheel: Path, tmp_path: Path) -> str:
    """What `shaperd --version` prints from the unpacked wheel: no .git beside the package, no stamp."""
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    r = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from shaperd.cli.main import main; main(['--version'])", str(unpacked)],
                       capture_output=True, text=True, timeout=DEADLINE_S, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_wheel_built_at_a_tag_says_its_version_and_commit(tmp_path):
    repo, head = tagged_copy(tmp_path, "v1.2.3")
    wheel = build_wheel(repo, tmp_path / "dist")
    assert wheel.name == "shaperd-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        assert "version: 1.2.3" in z.read("shaperd-1.2.3.dist-info/METADATA").decode().lower()
    assert version_of_wheel(wheel, tmp_path).startswith(f"shaperd 1.2.3 (commit {head[:12]}; ")


def test_a_wheel_built_from_the_sdist_keeps_the_tag_and_the_commit(tmp_path):
    # The sdist has no .git: its PKG-INFO and shaperd/_version.json carry the version and commit on.
    repo, head = tagged_copy(tmp_path, "v2.0.0")
    sdist_dir = tmp_path / "sdist"
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(sdist_dir)],
                       cwd=repo, capture_output=True, text=True, env=GIT_ENV, timeout=DEADLINE_S, check=True)
    assert r.stdout.strip().splitlines()[-1] == "shaperd-2.0.0.tar.gz"
    import tarfile

    with tarfile.open(sdist_dir / "shaperd-2.0.0.tar.gz") as t:
        t.extractall(tmp_path / "unpacked", filter="data")
    src = tmp_path / "unpacked" / "shaperd-2.0.0"
    assert not (src / ".git").exists()
    wheel = build_wheel(src, tmp_path / "dist")
    assert wheel.name == "shaperd-2.0.0-py3-none-any.whl"
    assert version_of_wheel(wheel, tmp_path).startswith(f"shaperd 2.0.0 (commit {head[:12]}; ")


def test_an_editable_checkout_asks_git_for_its_commit(tmp_path):
    # The checkout's root is the package directory's parent; ".git" beside the package, not inside it.
    repo = new_repo(tmp_path)
    (repo / "shaperd").mkdir()
    head = git(repo, "rev-parse", "HEAD")
    info = buildinfo.build_info(build_file=tmp_path / "none.json", package_dir=repo / "shaperd",
                                built_commit=lambda: "g" + "f" * 40)
    assert info["commit"] == head[:12]
    # this checkout, as the editable install in .venv runs it
    if (ROOT / ".git").exists():
        info = buildinfo.build_info(build_file=tmp_path / "none.json", built_commit=lambda: None)
        assert info["commit"] == git(ROOT, "rev-parse", "--short=12", "HEAD")
    # not a checkout: the build's commit from _version.json ('g' + the full id, as setuptools-scm writes it)
    info = buildinfo.build_info(build_file=tmp_path / "none.json", package_dir=tmp_path / "site" / "shaperd",
                                built_commit=lambda: buildinfo._short("g" + "a" * 40))
    assert info["commit"] == "a" * 12
    assert cli_meta.version_text({**info, "version": "1.2.3"}).startswith(f"shaperd 1.2.3 (commit {'a' * 12}; ")
    # neither: unknown, never made up
    info = buildinfo.build_info(build_file=tmp_path / "none.json", package_dir=tmp_path / "site" / "shaperd",
                                built_commit=lambda: None)
    assert info["commit"] is None and "commit unknown" in cli_meta.version_text(info)
