"""What a reconcile could not enforce: the plan's problems and the targets left alone.

A node is *degraded* when the last reconcile ran but some of what the
tenants file asks for is not in the kernel, and asking again will not change
that: a plan problem (a ConfigProblem: no capacity known for a device, a
name two tenants share ...), or a target a backend deliberately left alone
(``TargetDiff.blocked``: a root qdisc or a file that is not shaperd's), or a
system call the agent needs refused by what it runs under (``refused``: bpf()
refused by a seccomp filter, ``Capabilities.bpf_refused``; the eBPF paths are
then off on every device, so it comes first in ``line``).
Failed writes and unreadable devices are not here: they are failures, retried
with backoff and counted in ``shaperd_reconcile_errors_total``.

Owns ``Degraded``, the one summary of that, built from a reconcile's Report
(engine/reconciler.py), so the daemon's systemd STATUS= line, its /healthz
and /readyz bodies, the ``shaperd_degraded_targets`` gauge and ``shaperd
status`` say the same thing with the same words: the count, then the first
reason.

Pure: no I/O, no decision for the loop (degraded is not a reason to restart
or to retry sooner: a restart does not remove a foreign qdisc).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("blocked", "problem")  # the gauge's ``kind`` label values, always both


@dataclass(frozen=True)
class Blocked:
    """One target left alone on purpose: which backend, which target (a device or a file), and why."""

    backend: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f"{self.backend} {self.target}: {self.reason}"


# Capabilities.bpf_refused (kernel/probe.py) -> what the degraded line says of it.
REFUSALS = {
    "bpf_refused_by_seccomp": "bpf() refused by seccomp (likely the container runtime's RuntimeDefault profile): "
                              "cls_bpf, the eBPF classifier, marks and edt off",
}


@dataclass(frozen=True)
class Degraded:
    problems: tuple[str, ...] = ()  # the plan's ConfigProblems, as text ("field.path: what")
    blocked: tuple[Blocked, ...] = ()
    refused: tuple[str, ...] = ()  # Capabilities.bpf_refused reasons ("bpf_refused_by_seccomp"): REFUSALS' keys

    @property
    def count(self) -> int:
        return len(self.problems) + len(self.blocked) + len(self.refused)

    def __bool__(self) -> bool:
        return self.count > 0

    def by_kind(self) -> dict[str, int]:
        return {"blocked": len(self.blocked), "problem": len(self.problems)}

    @property
    def first_reason(self) -> str | None:
        """A refused system call, else the first target left alone, else the first plan problem (``line``'s order)."""
        if self.refused:
            return REFUSALS.get(self.refused[0], self.refused[0])
        if self.blocked:
            return str(self.blocked[0])
        return self.problems[0] if self.problems else None

    def line(self) -> str:
        """'degraded: 1 target not enforced (htb v0: root qdisc tbf 1: is not shaperd's; left alone ...)'; '' when
        nothing is degraded."""
        if not self:
            return ""
        parts = []
        if self.refused:
            parts.append(_count(len(self.refused), "system call") + " refused")
        if self.blocked:
            parts.append(_count(len(self.blocked), "target") + " not enforced")
        if self.problems:
            parts.append(_count(len(self.problems), "plan problem"))
        return f"degraded: {', '.join(parts)} ({self.first_reason})"

    def render(self) -> str:
        """``line()``, then every other reason on its own line (``shaperd status``)."""
        rest = [REFUSALS.get(r, r) for r in self.refused] + [str(b) for b in self.blocked] + list(self.problems)
        return "\n".join([self.line()] + [f"  {r}" for r in rest[1:]]) if self else ""

    def doc(self) -> dict:
        """``shaperd status -o json``'s ``degraded`` object (count 0 and empty lists when all is enforced)."""
        return {"count": self.count, "summary": self.line(), "problems": list(self.problems),
                "blocked": [{"backend": b.backend, "target": b.target, "reason": b.reason} for b in self.blocked],
                **({"refused": [{"reason": r, "message": REFUSALS.get(r, r)} for r in self.refused]}
                   if self.refused else {})}


def of_report(rep) -> Degraded:
    """The summary of one reconcile's (or diff's) Report: ``rep.problems``, the blocked ``rep.devices`` and the
    probe's refusal (``rep.inventory.capabilities.bpf_refused``)."""
    caps = getattr(getattr(rep, "inventory", None), "capabilities", None)
    refused = getattr(caps, "bpf_refused", "") or ""
    return Degraded(problems=tuple(str(p) for p in rep.problems),
                    blocked=tuple(Blocked(d.backend, d.device, d.blocked) for d in rep.devices if d.blocked),
                    refused=(refused,) if refused else ())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
