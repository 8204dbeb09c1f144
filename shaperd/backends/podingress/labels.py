"""Which pod each of shaperd's pod-ingress qdiscs is for, written by the applying process for ``shaperd status``.

A tbf in the kernel carries no name: ``shaperd status`` and ``shaperd top`` (other processes, often without
the Kubernetes API) learn the pod, tenant and cap behind an interface from
``<run>/shaperd/podingress-<scope>.json`` (scope "host" or "netns-<name>", as the bpffs pins), written
atomically by the process that applies, when its plan's pods change, and removed by a teardown. Format::

    {"pid": 1234, "pods": [{"device": "cali1", "ifindex": 7, "uid": "...", "namespace": "team-a",
                            "name": "web-0", "tenant": "tenant-a", "cap_bps": 50000000}]}

Labels only: ownership is read from the kernel (handle 7368:, kind tbf), never from this file.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from shaperd.core.atomicfile import write_atomic
from shaperd.kernel.bpf_pins import scope_for


def path_for(run_root: str | Path, netns: str | None) -> Path:
    return Path(run_root) / "shaperd" / f"podingress-{scope_for(netns)}.json"


def rows(plan) -> list[dict]:
    return [{"device": p.ifname, "ifindex": p.ifindex, "uid": p.uid, "namespace": p.namespace, "name": p.name,
             "tenant": p.tenant, "cap_bps": p.cap_bps} for p in plan.pods]


def write(path: Path, pods: list[dict]) -> None:
    """Write the pods' labels (atomically), or remove the file when there are none."""
    if not pods:
        remove(path)
        return
    doc = {"pid": os.getpid(), "pods": pods}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(doc, sort_keys=True) + "\n").encode(), 0o644)


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def read(path: Path) -> dict[int, dict]:
    """ifindex -> the pod's labels; {} where there is no (readable) file."""
    try:
        doc = json.loads(Path(path).read_text())
        return {int(p["ifindex"]): p for p in doc.get("pods", ())}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}
