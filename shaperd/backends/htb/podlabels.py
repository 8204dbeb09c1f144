"""Who the capped pods' classes are for, written for ``shaperd status`` and ``shaperd top`` to read.

A capped pod's class minor is derived from its uid (pods.py), which a status command run beside the
daemon does not know: it reads the kernel and the tenants file, not the Kubernetes API. So the process
that applies the HTB tree keeps ``<run>/shaperd/htb-pods-<scope>.json`` (scope: "host" or
"netns-<name>", as the refusals file and the bpffs pins), rewritten when the planned pod classes change
and removed when there are none (and on teardown). Format::

    {"pid": 1234,
     "pods": {"7368:74d6": {"pod": "team-a/trainer-0", "uid": "...", "tenant": "tenant-a", "cap_bps": 100000000}},
     "rests": {"7368:9845": "tenant-a"}}

``tenant`` is null for a pod of no tenant. Labels only: nothing is decided from this file, and a class
it does not name is still shown (by its id).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from shaperd.backends.common.objects import fmt_handle


def path_for(run_root: str | Path, netns: str | None) -> Path:
    scope = f"netns-{netns}" if netns else "host"
    return Path(run_root) / "shaperd" / f"htb-pods-{scope}.json"


def doc_of(plan) -> dict:
    """The labels of an HtbPlan (pods and the rest leaves their tenants got); {} for none."""
    pods = {fmt_handle(p.classid): {"pod": p.ref, "uid": p.uid, "tenant": p.tenant, "cap_bps": p.cap_bps}
            for p in plan.pods}
    if not pods:
        return {}
    return {"pods": pods, "rests": {fmt_handle(cid): t for t, cid in sorted(plan.rests.items())}}


def record(path: Path, doc: dict) -> None:
    """Write ``doc`` (atomically), or remove the file when it is empty."""
    from shaperd.core.atomicfile import write_atomic

    if not doc:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps({"pid": os.getpid(), **doc}, sort_keys=True) + "\n").encode(), 0o644)


def read(path: Path | None) -> tuple[dict[int, dict], dict[int, str]]:
    """(classid -> pod entry, classid -> tenant of a rest leaf); empty where there is no readable file."""
    if path is None:
        return {}, {}
    try:
        doc = json.loads(Path(path).read_text())
        pods = {_cid(h): dict(v) for h, v in doc.get("pods", {}).items()}
        rests = {_cid(h): str(t) for h, t in doc.get("rests", {}).items()}
        return pods, rests
    except (OSError, ValueError, AttributeError, TypeError):
        return {}, {}


def _cid(handle: str) -> int:
    major, minor = handle.split(":")
    return int(major, 16) << 16 | int(minor, 16)
