"""A release bundle made, verified, signed and installed offline, in a temporary tagged clone (root).

scripts/release --no-images (sdist, wheel, hashed lock, wheelhouse, SHA256SUMS, a signature with
a throwaway GPG key in a temporary GNUPGHOME), scripts/verify-release on it (sha256sum -c,
gpg --verify), then the bundle's own install-baremetal into a temporary prefix inside a fresh
network namespace holding only lo (unshare --net: no index, no proxy can be reached), an upgrade
over it and --rollback. The image half (buildah, debootstrap) runs in .ci/run on every CI run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.procs import run

ROOT = Path(__file__).resolve().parents[2]
TAG, VERSION = "v0.0.0rc9", "0.0.0rc9"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("gpg") or not Path("/usr/bin/python3").exists(),
    reason="needs root, unshare, gpg and /usr/bin/python3")
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=120).stdout.strip()


@pytest.fixture
def gnupghome():
    # Short path: gpg-agent's socket lives in it (sun_path is 108 bytes).
    home = tempfile.mkdtemp(prefix="gpg.", dir="/tmp")
    env = {**os.environ, "GNUPGHOME": home}
    try:
        subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "shaperd test <t@example.invalid>",
                        "ed25519", "sign", "1d"], env=env, check=True, capture_output=True, timeout=120)
        yield home
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, timeout=30)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow  # 8-35 s (--durations, quiet)
def test_a_signed_bundle_verifies_and_installs_offline_with_hashes_then_rolls_back(tmp_path, gnupghome):
    repo = tmp_path / "repo"
    git(tmp_path, "clone", "-q", str(ROOT), str(repo))
    git(repo, "tag", "-a", TAG, "-m", "test release")
    commit = git(repo, "rev-parse", "HEAD")
    env = {**os.environ, "GNUPGHOME": gnupghome}
    r = subprocess.run([sys.executable, str(repo / "scripts" / "release"), "--no-images", "--sign-key",
                        "t@example.invalid"], cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    out = repo / "dist" / "release"
    for f in (f"shaperd-{VERSION}.tar.gz", f"shaperd-{VERSION}-py3-none-any.whl", "requirements.lock",
              "SHA256SUMS", "SHA256SUMS.asc", "install-baremetal", "share/systemd/shaperd.service",
              f"wheelhouse/shaperd-{VERSION}-py3-none-any.whl"):
        assert (out / f).is_file(), f
    assert any(p.name.startswith("grpcio-") and "aarch64" in p.name for p in (out / "wheelhouse").iterdir())
    v = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify-release"), str(out), "--signed"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert v.returncode == 0 and "Good signature" in v.stdout, v.stdout + v.stderr
    # The runbook links in the bundle's manifests point at the tag.
    rule = (out / "manifests" / "daemonset" / "components" / "monitoring" / "prometheusrule.yaml").read_text()
    assert f"/blob/{TAG}/docs/" in rule and "/blob/main/docs/" not in rule

    # The offline install: a fresh network namespace with only lo, the host's Python (Debian's).
    prefix, units, conf = tmp_path / "opt" / "shaperd", tmp_path / "units", tmp_path / "etc"
    install = ["unshare", "--net", "bash", str(out / "install-baremetal"), "--prefix", str(prefix),
               "--unit-dir", str(units), "--config-dir", str(conf), "--no-systemctl"]
    probe = run(["unshare", "--net", "/usr/bin/python3", "-c",
                 "import socket\ntry:\n socket.create_connection(('198.18.0.1', 3128), timeout=3)\n"
                 "except OSError as e: print('unreachable', e.errno)"], timeout_s=30)
    assert probe.stdout.startswith("unreachable"), probe.stdout
    i = subprocess.run(install, env=HOST_ENV, capture_output=True, text=True, timeout=900)
    assert i.returncode == 0, i.stdout + i.stderr[-3000:]
    ver = run([str(prefix / "bin" / "shaperd"), "--version"]).stdout
    assert VERSION in ver and commit[:12] in ver, ver
    assert (units / "shaperd.service").read_text().count(str(prefix / "bin" / "shaperd")) >= 1
    # A tampered bundle is refused before anything is touched.
    lock = out / "requirements.lock"
    saved = lock.read_bytes()
    lock.write_bytes(saved + b"\n")
    bad = subprocess.run(install, env=HOST_ENV, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "SHA256SUMS does not match" in bad.stderr, bad.stderr
    lock.write_bytes(saved)
    # An upgrade over it keeps the old venv; --rollback brings it back.
    assert subprocess.run(install, env=HOST_ENV, capture_output=True, text=True, timeout=900).returncode == 0
    assert (prefix.parent / "shaperd.previous" / "bin" / "shaperd").exists()
    rb = run(["bash", str(out / "install-baremetal"), "--prefix", str(prefix), "--rollback"], timeout_s=120)
    assert "rolled back to" in rb.stdout and VERSION in rb.stdout, rb.stdout
    assert not (prefix.parent / "shaperd.previous").exists()
