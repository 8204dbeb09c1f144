"""The CLI's commands about itself: ``--version`` (build details) and ``completion bash|zsh``.

Build details (buildinfo.py): the version (from the git tag, written by the
build), the git commit (the build's, or asked from git in a checkout), Python
and pyroute2. ``completion`` prints a shell
script generated from the argparse parser by shtab, so it never drifts
from the options: shtab reads the parser itself (subcommands, choices,
file arguments), has no dependencies and runs nothing at completion time
(the script is static), unlike argcomplete, which re-runs the program on
every <TAB> (slow with our imports) and needs a hook in the entry point.

Must not: touch the kernel, the network or the tenants file.
"""

from __future__ import annotations

import argparse

from shaperd.core.exitcodes import EXIT_OK

SHELLS = ("bash", "zsh")


def version_text(info: dict | None = None) -> str:
    # Imported here: buildinfo needs importlib.metadata (email, zipfile, csv: ~45 modules), and this module is
    # imported by every command line (cli/main.py), which needs it only for --version.
    from shaperd.core.buildinfo import build_info

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
    # The root parser, put into every parse by cli/main.build_parser (importing it here would be a cycle).
    print(completion_script(args.root_parser, args.shell), end="")
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script. bash: "
                       "shaperd completion bash > /etc/bash_completion.d/shaperd; zsh: "
                       "shaperd completion zsh > \"${fpath[1]}/_shaperd\"")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(fn=cmd_completion)
