"""``shaperd demo``: build a namespace test bed and measure isolation (root).

The bed is a separate distribution (shaperd-testbed, ``pip install
./testbed``), kept out of the agent's install and image; it is imported
only here. Without it the command takes any arguments and says how to
install it, instead of argparse rejecting the bed's options.
"""

from __future__ import annotations

import sys

from shaperd.core.exitcodes import EXIT_BAD_INPUT

BED_MISSING = ("shaperd demo: the test bed is not installed; it is a separate distribution in this "
               "repository (shaperd-testbed, kept out of the agent's install and image): "
               "pip install ./testbed, or run sudo ./scripts/demo")


HELP = "build a namespace test bed and measure isolation (root)"


def register_stub(sub) -> None:
    """The command's line in ``shaperd --help`` without importing the bed (cli/main.py builds it whole only
    when the command line says ``demo``): the bed's parser costs a daemon 1.2 MiB of RSS it never uses."""
    p = sub.add_parser("demo", help=HELP, prefix_chars="\0", add_help=False)
    p.add_argument("bed_args", nargs="*")
    p.set_defaults(fn=cmd_demo)


def register(sub) -> None:
    try:
        from shaperd_bed import demo  # the separate shaperd-testbed distribution, imported only here
    except ImportError:
        # Without the bed, take any arguments (no option parsing at all) so that cmd_demo can
        # say how to install it instead of argparse rejecting the bed's options.
        p = sub.add_parser("demo", help="build a namespace test bed and measure isolation (root; needs "
                           "pip install ./testbed)", prefix_chars="\0", add_help=False)
        p.add_argument("bed_args", nargs="*")
    else:
        p = sub.add_parser("demo", help=HELP)
        demo.add_arguments(p)
    p.set_defaults(fn=cmd_demo)


def cmd_demo(args) -> int:
    try:
        from shaperd_bed import demo
    except ModuleNotFoundError as e:
        if e.name != "shaperd_bed":
            raise  # the bed is there but broken: show the real error
        print(BED_MISSING, file=sys.stderr)
        return EXIT_BAD_INPUT
    return demo.run(args)
