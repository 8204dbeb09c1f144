"""What backends' applies found the kernel refuses, collected for the next plan; and the report of the re-plan.

A backend may keep, in memory, devices where its apply showed the kernel
cannot do what it planned (the edt backend: a qdisc kind the kernel does not
know, backends/edt/refusals.py). It exposes them as ``refused(inv)`` ->
{device: (ifindex, reason)}. The reconciler hands them to the next plan as
data (PlanInput.refused) and, when an apply added one, plans and applies once
more at once, so the device is enforced by the fallback in the same
reconcile rather than at the next resync. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import replace


def collect(backends, inv) -> dict[str, dict]:
    """backend name -> {device: (ifindex, reason)} for every backend that keeps refusals (non-empty only)."""
    out = {}
    for b in backends:
        fn = getattr(b, "refused", None)
        if callable(fn) and (r := fn(inv)):
            out[b.name] = r
    return out


def added(before: dict, after: dict) -> bool:
    """True when ``after`` holds a refusal ``before`` did not (forgotten ones do not count)."""
    return any(before.get(b, {}).get(dev) != v for b, devs in after.items() for dev, v in devs.items())


def merged(first, second):
    """The second pass's report, with the first pass's landed writes kept (their count and log are real)."""
    by_name = {bo.name: bo for bo in first.backends}
    backends = []
    for bo in second.backends:
        earlier = [replace(t, failed=[], blocked=None, error=None) for t in getattr(by_name.get(bo.name), "targets", ())
                   if t.ops]
        backends.append(replace(bo, targets=earlier + bo.targets))
    return replace(second, backends=backends, duration_s=first.duration_s + second.duration_s)
