"""The CLI's commands about itself: ``--version`` (build details) and ``completion bash|zsh``.

Build details: the version, the git commit (from ``shaperd/_build.json``,
written at build time by ``scripts/stamp-build``; from a git checkout when
shaperd runs from one), Python and pyroute2. ``completion`` prints a shell
script generated from the argparse parser by shtab, so it never drifts
from the options: shtab reads the parser itself (subcommands, choices,
file arguments), has no dependencies and runs nothing at completion time
(the script is static), unlike argcomplete, which re-runs the program on
every <TAB> (slow with our imports) and needs a hook in the entry point.

Must not: touch the kernel, the network or the tenants file.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from . import __version__

BUILD_FILE = Path(__file__).with_name("_build.json")
GIT_DEADLINE_S = 2.0
SHELLS = ("bash", "zsh")


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


def version_text(info: dict | None = None) -> str:
    i = build_info() if info is None else info
    return (f"shaperd {i['version']} (commit {i['commit'] or 'unknown'}"
            + (f", built {i['built']}" if i.get("built") else "")
            + f"; {i['python']}; pyroute2 {i['pyroute2'] or 'not installed'})")


class VersionAction(argparse.Action):
    """``--version``: the build details, computed only when asked (building the parser runs no git)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def completion_script(parser, shell: str) -> str:
    import shtab

    return shtab.complete(parser, shell=shell)


def cmd_completion(args) -> int:
    from .cli import build_parser

    print(completion_script(build_parser(), args.shell), end="")
    return 0


def register(sub) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script. bash: "
                       "shaperd completion bash > /etc/bash_completion.d/shaperd; zsh: "
                       "shaperd completion zsh > \"${fpath[1]}/_shaperd\"")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(fn=cmd_completion)
