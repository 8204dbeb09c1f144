"""scripts/release's refusals, scripts/sbom's reading of an image root, scripts/verify-release's checks.

The refusals run the real script in a temporary clone (no build happens: it stops first). The
SBOM and the checker run on small trees made here, so they need no root, network or image.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import run

ROOT = Path(__file__).resolve().parents[2]


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                   check=True, capture_output=True, timeout=60)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("x\n")
    git(repo, "init", "-q")
    git(repo, "add", "README.md")
    git(repo, "commit", "-qm", "one")
    return repo


def release(repo: Path, *extra: str):
    return run([sys.executable, str(ROOT / "scripts" / "release"), "--repo", str(repo), "--no-images",
                "--out", str(repo / "out"), *extra], timeout_s=60, check=False)


def test_an_untagged_commit_is_refused_by_name_and_nothing_is_built(clone):
    r = release(clone)
    assert r.returncode == 2 and "has no tag" in r.stderr and "refusing commit" in r.stderr, r.stderr
    assert not (clone / "out").exists()


def test_a_dirty_tree_is_refused_even_at_a_tag(clone):
    git(clone, "tag", "-a", "v1.2.3", "-m", "t")
    (clone / "README.md").write_text("changed\n")
    r = release(clone)
    assert r.returncode == 2 and "dirty tree" in r.stderr and "README.md" in r.stderr, r.stderr
    (clone / "README.md").write_text("x\n")
    (clone / "new.txt").write_text("untracked\n")
    r = release(clone)
    assert r.returncode == 2 and "dirty tree" in r.stderr and "new.txt" in r.stderr, r.stderr
    assert not (clone / "out").exists()


def test_a_commit_after_the_tag_is_refused_too(clone):
    git(clone, "tag", "-a", "v1.2.3", "-m", "t")
    (clone / "README.md").write_text("two\n")
    git(clone, "commit", "-qam", "two")
    r = release(clone)
    assert r.returncode == 2 and "has no tag" in r.stderr, r.stderr


def test_an_unknown_architecture_is_refused(clone):
    git(clone, "tag", "-a", "v1.2.3", "-m", "t")
    r = release(clone, "--arch", "amd64,s390x")
    assert r.returncode == 2 and "s390x" in r.stderr


def fake_root(root: Path) -> Path:
    sp = root / "opt" / "shaperd" / "lib" / "python3.11" / "site-packages"
    for name, ver in (("pyroute2", "0.9.7"), ("grpcio", "1.85.3"), ("shaperd", "1.2.3")):
        d = sp / f"{name}-{ver}.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\nLicense: Apache-2.0\n\nbody\n")
    st = root / "var" / "lib" / "dpkg"
    st.mkdir(parents=True)
    (st / "status").write_text(
        "Package: python3\nStatus: install ok installed\nArchitecture: arm64\nVersion: 3.11.2-1+b1\n"
        "Description: x\n more\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nArchitecture: arm64\nVersion: 1\n\n")
    return root


def test_the_sbom_lists_the_venv_and_the_installed_debian_packages_only(tmp_path):
    root = fake_root(tmp_path / "root")
    out = tmp_path / "x.cdx.json"
    r = run([sys.executable, str(ROOT / "scripts" / "sbom"), "--root", str(root), "--version", "1.2.3",
             "--arch", "arm64", "-o", str(out)], timeout_s=60, check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    purls = {c["purl"] for c in doc["components"]}
    assert "pkg:pypi/pyroute2@0.9.7" in purls and "pkg:pypi/grpcio@1.85.3" in purls
    assert "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=arm64&distro=debian-12" in purls
    assert not any("gone" in p for p in purls)  # removed, only its config files left
    assert doc["metadata"]["component"]["properties"] == [{"name": "oci:platform", "value": "linux/arm64"}]


def test_the_sbom_refuses_a_tree_that_is_no_image_root(tmp_path):
    r = run([sys.executable, str(ROOT / "scripts" / "sbom"), "--root", str(tmp_path), "--version", "1",
             "--arch", "amd64", "-o", str(tmp_path / "x.json")], timeout_s=60, check=False)
    assert r.returncode != 0 and "not an image root" in r.stderr


def small_bundle(d: Path) -> Path:
    d.mkdir()
    wheel = d / "shaperd-1.2.3-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    h = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (d / "requirements.lock").write_text(f"pyroute2==0.9.7 \\\n    --hash=sha256:{'a' * 64}\n"
                                         f"shaperd==1.2.3 \\\n    --hash=sha256:{h}\n")
    files = sorted(p for p in d.iterdir())
    (d / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in files))
    return d


def verify(d: Path, *extra: str):
    return run([sys.executable, str(ROOT / "scripts" / "verify-release"), str(d), *extra], timeout_s=60, check=False)


def test_verify_release_passes_a_whole_bundle_and_names_each_fault(tmp_path):
    d = small_bundle(tmp_path / "b")
    ok = verify(d)
    assert ok.returncode == 0 and "2 OK" in ok.stdout, ok.stdout + ok.stderr
    (d / "requirements.lock").write_text((d / "requirements.lock").read_text() + "psutil==7.2.2\n")
    bad = verify(d)
    assert bad.returncode == 1 and "sha256sum -c failed" in bad.stderr and "['psutil==7.2.2']" in bad.stderr, bad.stderr
    (d / "extra.txt").write_text("x")
    assert "extra.txt is not in SHA256SUMS" in verify(d).stderr
    missing = verify(small_bundle(tmp_path / "c"), "--arch", "amd64")
    assert missing.returncode == 1 and "shaperd-1.2.3-linux-amd64.oci.tar: missing" in missing.stderr
