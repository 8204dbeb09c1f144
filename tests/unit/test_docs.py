"""The docs for readers hold against the tree: the layout page matches it, links and named paths resolve,
no heading names an issue number, and the README stays short.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN_LAYOUT = ROOT / "scripts" / "gen-layout"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Pages whose headings a reader meets without knowing the project's issues (CHANGELOG.md is the history).
READER_PAGES = [README, ROOT / "BENCHMARKS.md", *DOCS]
LINKED_PAGES = [README, *DOCS, ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md"]
README_MAX_LINES = 220
PLANNED: set[str] = set()  # paths docs may name before they exist: none


def gen_layout():
    loader = importlib.machinery.SourceFileLoader("gen_layout", str(GEN_LAYOUT))
    spec = importlib.util.spec_from_loader("gen_layout", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def prose_paragraphs(text: str):
    """(first line number, text) of each run of prose lines, so a code span may wrap onto the next line."""
    block: list[str] = []
    start = 0
    last = 0
    for n, line in prose_lines(text):
        if line.startswith(("|", "#")):  # a table row or a heading is a paragraph of its own
            if block:
                yield start, "\n".join(block)
            yield n, line
            block, last = [], n
            continue
        if not line.strip() or n != last + 1:
            if block:
                yield start, "\n".join(block)
            block, start = ([line], n) if line.strip() else ([], 0)
        else:
            if not block:
                start = n
            block.append(line)
        last = n
    if block:
        yield start, "\n".join(block)


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for _, line in prose_lines(text) if re.match(r"#{1,6} ", line)]


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation and symbols dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for h in headings(path.read_text()):
        a = github_anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


ISSUE_RE = re.compile(r"\bissues?\s*#?\s*\d|(?<![\w&])#\d+\b", re.I)


def names_an_issue(heading: str) -> bool:
    return bool(ISSUE_RE.search(heading))


# A code span: a run of backticks, its text, the same run again (CommonMark), so ``x`` is one span.
CODE_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)


def code_spans(text: str) -> list[str]:
    return [m.group(2).strip() for m in CODE_RE.finditer(text)]


def links(text: str):
    """(line number, target) of every Markdown link outside code."""
    for n, para in prose_paragraphs(text):
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", CODE_RE.sub("", para)):
            yield n, target


def test_the_layout_page_is_what_the_generator_makes_from_the_tree():
    r = subprocess.run([sys.executable, str(GEN_LAYOUT), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + "\nrun scripts/gen-layout and commit docs/layout.md"


def test_every_package_and_module_has_a_row_with_its_docstring():
    """Independent of the generator's walk: every .py under shaperd/ is a row, with its docstring's first line."""
    page = (ROOT / "docs" / "layout.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.*) \|$", page, re.M))
    for path in sorted((ROOT / "shaperd").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        shown = rel[: -len("__init__.py")] if path.name == "__init__.py" else rel
        assert shown in rows, f"docs/layout.md has no row for {shown}: run scripts/gen-layout"
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc:
            first = next(l.strip() for l in doc.splitlines() if l.strip())
            assert rows[shown] == " ".join(first.split()).replace("|", "\\|"), shown
    listed = {p for p in rows if p.startswith("shaperd/")}
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "shaperd").rglob("*.py")}
    for p in listed:
        assert (p + "__init__.py" if p.endswith("/") else p) in on_disk, f"docs/layout.md lists {p}, which is gone"


def test_a_new_module_makes_the_layout_check_fail_until_regenerated(tmp_path):
    """What another engineer's move does: --check fails, one run of the script fixes it, and only the table changed."""
    pkg = tmp_path / "shaperd"
    shutil.copytree(ROOT / "shaperd", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    page = tmp_path / "layout.md"
    page.write_text((ROOT / "docs" / "layout.md").read_text())
    (pkg / "backends" / "toy").mkdir()
    (pkg / "backends" / "toy" / "__init__.py").write_text('"""A toy backend."""\n')
    (pkg / "backends" / "toy" / "plan.py").write_text('"""Plan the toy, pure."""\n')
    (pkg / "core" / "units.py").unlink()
    args = [sys.executable, str(GEN_LAYOUT), "--package", str(pkg), "--page", str(page)]
    assert subprocess.run(args + ["--check"], capture_output=True, timeout=60).returncode == 1
    assert subprocess.run(args, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run(args + ["--check"], capture_output=True, timeout=60).returncode == 0
    text = page.read_text()
    assert "| `shaperd/backends/toy/` | A toy backend. |" in text
    assert "| `shaperd/backends/toy/plan.py` | Plan the toy, pure. |" in text
    assert "shaperd/core/units.py" not in text
    g = gen_layout()
    before = (ROOT / "docs" / "layout.md").read_text()
    assert before.split(g.BEGIN)[0] == text.split(g.BEGIN)[0] and before.split(g.END)[1] == text.split(g.END)[1]


def test_the_layout_lists_packages_in_layer_order():
    g = gen_layout()
    tops = []
    for shown, _ in g.entries():
        parts = shown.rstrip("/").split("/")
        if len(parts) == 2 and shown.endswith("/") and parts[1] not in tops:
            tops.append(parts[1])
    known = [t for t in tops if t in g.LAYERS]
    assert known == [layer for layer in g.LAYERS if layer in known]
    assert {"core", "kernel", "backends", "engine", "report", "cli"} <= set(known)


def test_the_issue_check_catches_what_it_is_for():
    for bad in ("Issue 12: ConfigMap through the API", "EDT with NET_ADMIN + BPF only (issue 15, gap 3)",
                "Known limits (issues 11-14)", "Follow-ups to #15"):
        assert names_an_issue(bad), bad
    for good in ("Data plane isolation", "Sizing for 100–400 Gbit NICs", "HTB offload", "Runbook: not reconciling"):
        assert not names_an_issue(good), good


@pytest.mark.parametrize("page", READER_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_heading_names_an_issue(page):
    bad = [h for h in headings(page.read_text()) if names_an_issue(h)]
    assert not bad, f"{page.name}: headings name an issue (a reader does not know them; history goes to CHANGELOG.md): {bad}"


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it to a newcomer's first ten minutes, the rest in docs/"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#")[0]).resolve() for _, t in links(README.read_text())}
    assert set(p.resolve() for p in DOCS) <= linked, "a docs/ page the README does not link"


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for n, target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, file:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}:{n}: {target} (no heading #{anchor} in {dest.name})")
    assert not broken, "\n".join(broken)


# A word in backticks that names a path of the repository: under shaperd/ (also written from the layer down,
# kernel/probe.py), or one of the other top-level folders. Only names with a file suffix or a trailing slash
# count, so resource names such as rdma/hca_shared_devices_a are not taken for paths.
_LAYER_DIRS = "core|kernel|discovery|rdma|backends|engine|report|webhook|daemon|cli"
_PATH_RE = re.compile(
    rf"^(?:(?P<pkg>(?:shaperd/)?(?:{_LAYER_DIRS})/)|(?P<repo>(?:tests|bench|scripts|daemonset|deploy|systemd|schema"
    rf"|examples|testbed|docs)/))[\w./*%-]*$")


def named_paths(text: str):
    for n, para in prose_paragraphs(text):
        for span in code_spans(para):
            for word in span.split():
                word = word.strip(",;:()")
                m = _PATH_RE.match(word)
                if not m or not (word.endswith("/") or re.search(r"\.(py|ya?ml|json|md|proto|service)$", word)):
                    continue
                rel = word if word.startswith("shaperd/") or m.group("repo") else "shaperd/" + word
                yield n, rel


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_the_docs_name_exists(page):
    missing = [f"{page.name}:{n}: {rel}" for n, rel in named_paths(page.read_text())
               if rel not in PLANNED and not any(ROOT.glob(rel.rstrip("/")))]
    assert not missing, "paths named in the docs that are not in the tree:\n" + "\n".join(missing)
