"""Containerfile and .containerignore: what the image build may see and what the image declares.

scripts/build-image checks the built image itself (user, labels, healthcheck, no tests or
test bed inside, a size ceiling); these are the static halves, without root or buildah.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CF = (ROOT / "Containerfile").read_text()


def ignored(path: str) -> bool:
    """The last matching pattern of .containerignore decides (a ! line re-admits), as buildah reads it."""
    verdict = False
    for raw in (ROOT / ".containerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg, pat = line.startswith("!"), line.lstrip("!")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat.rstrip("/") + "/"):
            verdict = not neg
    return verdict


def test_the_build_context_is_the_wheelhouse_and_the_license_only():
    for p in (".git/config", ".venv/bin/python", "tests/unit/test_x.py", "bench/apply_perf.py",
              "testbed/pyproject.toml", "shaperd/cli/main.py", "README.md", "build/lib/shaperd/cli.py"):
        assert ignored(p), p
    assert not ignored("build/wheelhouse/shaperd-0.1.0-py3-none-any.whl") and not ignored("LICENSE")
    for src in re.findall(r"^COPY (?!--from)(\S+)", CF, re.M):
        assert not ignored(src), f"COPY {src} is excluded from the context"


def test_multi_stage_non_root_labelled_with_a_healthcheck():
    assert len(re.findall(r"^FROM ", CF, re.M)) >= 2 and "COPY --from=build /opt/shaperd /opt/shaperd" in CF
    (user,) = re.findall(r"^USER (\S+)", CF, re.M)
    assert user.split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK .*\n?.*CMD \[", CF, re.M) and "/healthz" in CF
    for k in ("title", "version", "revision", "created", "licenses", "source"):
        assert f"org.opencontainers.image.{k}=" in CF, k
    assert 'licenses="Apache-2.0"' in CF and (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "tests" not in re.findall(r"^COPY (\S+)", CF, re.M)


def test_one_copy_of_the_image_build_shared_by_release_and_ci():
    release = (ROOT / "scripts" / "release").read_text()
    build = (ROOT / "scripts" / "build-image").read_text()
    # release calls build-image per architecture and builds nothing itself
    assert '"build-image"' in release and '"buildah"' not in release and '"debootstrap"' not in release
    for flag in ("--arch", "--wheelhouse", "--oci-archive", "--sbom", "--revision"):
        assert f'"{flag}"' in release and f"{flag})" in build, flag
    assert '--platform "linux/$arch"' in build and 'debootstrap --arch="$arch"' in build
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/release" in ci and "scripts/verify-release" in ci and "SHAPERD_RELEASE_ARM64" in ci
    assert "build-image" not in ci.split("exec ")[0].replace("# ", "")  # no second, separate image build
