"""Where the kernel refused what a backend planned (the edt data plane; htb offload), written for ``shaperd status`` to read.

The refusals themselves live in the applying process's memory (backends/edt/refusals.py):
forgotten on restart, re-verified. So that ``shaperd status`` (another process) can say
why an uplink asked to be on edt is on htb, the reconciler opened by ``open_node`` keeps
them in ``<run>/shaperd/refused-<scope>.json`` (scope: "host" or "netns-<name>", as the
bpffs pins): written when they change, removed when there are none (a restarted daemon's
first apply clears what the old one found) and on teardown. Format::

    {"pid": 1234, "refused": {"edt": {"eth0": {"ifindex": 7, "reason": "..."}}}}

Owns that file and its rendering; never decides anything from it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def path_for(run_root: str | Path, netns: str | None) -> Path:
    scope = f"netns-{netns}" if netns else "host"
    return Path(run_root) / "shaperd" / f"refused-{scope}.json"


def record(path: Path, refused: dict) -> None:
    """Write {backend: {device: (ifindex, reason)}} (atomically), or remove the file when empty."""
    from shaperd.core.atomicfile import write_atomic

    if not any(refused.values()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    doc = {"pid": os.getpid(), "refused": {b: {d: {"ifindex": i, "reason": r} for d, (i, r) in sorted(devs.items())}
                                          for b, devs in sorted(refused.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(doc, sort_keys=True) + "\n").encode())


def read(path: Path) -> dict[str, dict[str, dict]]:
    """{backend: {device: {"ifindex", "reason"}}}; {} where there is no (readable) file."""
    try:
        doc = json.loads(path.read_text())
        return {b: dict(devs) for b, devs in doc.get("refused", {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def doc(args) -> dict:
    """The ``-o json`` part: {"edt_refused": {device: reason}} where there are any."""
    got = read(path_for(getattr(args, "run_root", "/run"), getattr(args, "netns", None))).get("edt", {})
    return {"edt_refused": {d: v.get("reason", "") for d, v in sorted(got.items())}} if got else {}


def render(args) -> str:
    """The table's part: one line per uplink on htb because the kernel refused edt there; "" for none."""
    got = doc(args).get("edt_refused", {})
    if not got:
        return ""
    return "\n".join(["On htb because the kernel refused edt (node.dataplane edt/auto):"]
                     + [f"  {d}: {why}" for d, why in got.items()])
