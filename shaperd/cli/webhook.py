"""``shaperd webhook``: the mutating admission webhook that adds each tenant's NCCL settings to its pods.

Its arguments and its handler live with it (shaperd/webhook/); this module
only puts the command into the parser. A daemon: it writes log lines without
being asked (``log_lines``, cli/main.py).
"""

from __future__ import annotations


def register(sub) -> None:
    from shaperd import webhook

    p = sub.add_parser("webhook", help="the mutating admission webhook: adds each tenant's NCCL settings to its pods")
    webhook.add_arguments(p)
    p.set_defaults(log_lines=True)
