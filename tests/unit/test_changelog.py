"""CHANGELOG.md keeps the Keep a Changelog form (https://keepachangelog.com/en/1.1.0/).

A header naming Keep a Changelog and Semantic Versioning; "## [Unreleased]" first; then
releases "## [X.Y.Z] - YYYY-MM-DD", newest first; inside each, only the standard groups; every
bracketed heading has its link reference; no heading names an issue number.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE_RE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")
ISSUE_RE = re.compile(r"\b(issue|#)\s*\d+", re.I)


def problems(text: str) -> list[str]:
    out: list[str] = []
    lines = text.splitlines()
    head = text.split("\n## ", 1)[0]
    if not lines or lines[0] != "# Changelog":
        out.append("the first line is not '# Changelog'")
    for site in ("https://keepachangelog.com/", "https://semver.org/"):
        if site not in head:
            out.append(f"the header does not link {site}")
    sections = [ln for ln in lines if ln.startswith("## ")]
    if not sections or sections[0] != "## [Unreleased]":
        out.append("the first section is not '## [Unreleased]'")
    last: tuple | None = None
    for h in sections[1:]:
        m = RELEASE_RE.match(h)
        if not m:
            out.append(f"not a release heading '## [X.Y.Z] - YYYY-MM-DD': {h!r}")
            continue
        key = (tuple(int(x) for x in m.group(1, 2, 3)), m.group(4))
        if last is not None and not (key[0] < last[0] and key[1] <= last[1]):
            out.append(f"releases are not newest first at {h!r}")
        last = key
    for ln in lines:
        if ln.startswith("### ") and ln[4:] not in GROUPS:
            out.append(f"not a Keep a Changelog group: {ln!r}")
        if ln.startswith("#") and ISSUE_RE.search(ln):
            out.append(f"a heading names an issue: {ln!r}")
    refs = set(re.findall(r"^\[([^\]]+)\]: https?://\S+$", text, re.M))
    for h in sections:
        m = re.match(r"^## \[([^\]]+)\]", h)
        if m and m.group(1) not in refs:
            out.append(f"no link reference for [{m.group(1)}]")
    return out


def test_the_changelog_has_the_keep_a_changelog_form():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert problems(text) == []
    assert "\n## [0.1.0] - " in text  # the history so far is the first release


GOOD = """# Changelog

Based on [Keep a Changelog](https://keepachangelog.com/en/1.1.0/), [SemVer](https://semver.org/).

## [Unreleased]

### Added

- x

## [0.2.0] - 2026-12-03

### Fixed

- y

## [0.1.0] - 2026-12-02

[Unreleased]: https://example.invalid/compare/v0.2.0...HEAD
[0.2.0]: https://example.invalid/v0.2.0
[0.1.0]: https://example.invalid/v0.1.0
"""


@pytest.mark.parametrize("change,expected", [
    (("## [Unreleased]\n", "## Unreleased\n"), "the first section"),
    (("## [0.2.0] - 2026-12-03", "## [0.2.0] 2026-12-03"), "not a release heading"),
    (("## [0.2.0] - 2026-12-03", "## [0.0.9] - 2026-12-03"), "newest first"),
    (("### Fixed", "### Bug fixes"), "not a Keep a Changelog group"),
    (("### Added", "### Added in issue 21"), "not a Keep a Changelog group"),
    (("## [0.2.0] - 2026-12-03\n", "## [0.2.0] - 2026-12-03\n\n#### issue 21\n"), "names an issue"),
    (("[0.1.0]: https://example.invalid/v0.1.0\n", ""), "no link reference for [0.1.0]"),
    (("https://semver.org/", "semver"), "semver.org"),
])
def test_the_check_catches_what_it_is_for(change, expected):
    assert problems(GOOD) == []
    bad = GOOD.replace(*change)
    assert bad != GOOD
    assert any(expected in p for p in problems(bad)), problems(bad)
