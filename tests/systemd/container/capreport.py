"""Runs INSIDE the booted container, outside shaperd's sandbox: the daemon's own capability report.

Started by shaperd-test-caps.service (before shaperd.service) with the venv's python, as root with
the unit's two capabilities but none of its filters, it builds the reconciler exactly as
``shaperd run`` does (cli/node.reconciler, the same probe) and prints
Reconciler.capability_report() as JSON: what the node supports, to compare with what the daemon
logged from inside the unit. Nothing here is written to the node beyond the probe's own work.
"""

import json
import sys

from shaperd.cli.main import build_parser
from shaperd.cli.node import reconciler

args = build_parser().parse_args(["run", "--config", sys.argv[1]])
json.dump(reconciler(args).capability_report(), sys.stdout, sort_keys=True)
print()
