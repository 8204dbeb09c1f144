"""The backend protocol: the one surface every enforcement path implements.

An enforcement path (HTB on the uplinks, mark programs on pod interfaces,
and next RDMA service levels, VF rates, devlink rate groups, DCB, EDT) is a
backend with six steps:

- ``probe(caps)``: once, at start: can it run on this kernel, and how degraded;
- ``plan(ctx)``: pure, config + inventory (+ the shared tenancy) -> desired state;
- ``observe(reads, inv)``: read the state it owns from the kernel, into data;
- ``diff(desired, observed)``: pure, -> per-target lists of typed operations;
- ``apply(target_diff, batch)``: side effects only: execute the operations;
- ``stats(desired)``: what it contributes to status and metrics.

``teardown(observed)`` (pure) says what "nothing desired" is for the
backend: one TargetDiff per target it found, with the removals (none where
nothing of its is there), and ``error`` set where the target could not be
read (with whatever removals it could still plan there). It filters
nothing: the engine (shaperd/engine/teardown.py) keeps the targets with
removals, an error, ``blocked`` or a ``note``, applies the removals, and
fails the teardown on every target that could not be read, naming it and
what of the backend's may remain there (the optional ``teardown_remains``
text, e.g. "its root qdisc 7368: with its classes, leaves and filters").

A backend that attaches filters to the clsact qdisc (shared with other
agents) implements ``owns_clsact_filter(row) -> bool``: whether one filter
row (``parent`` = the ingress or egress hook, ``kind``, ``prio``,
``handle``, ``name``) is its own. The engine reads every clsact before the
teardown and removes one whose filters were all shaperd's, through the
``apply`` of a backend that owned one there (backends/common/clsact.py).

Optionally ``wanted(ctx) -> bool``: whether this tenants file, on this node,
asks for what the backend enforces; a disabled backend's probe notes become
plan warnings only then (without it: always), so one nothing needs is silent.
Optionally ``render(desired) -> str``: the desired state as the equivalent
command lines of the operators' own tools (``ip link``, ``devlink``,
``dcb``), printed by ``shaperd plan`` after the tc commands.

The engine (shaperd/engine/reconciler.py) loops over backends; a failure in
one is reported and never stops the others. Operations are typed: one class
per object kind, each building its own description and its own error, so no
caller parses text back out of a message. Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

from shaperd.core.config import Config
from shaperd.core.errors import ConfigProblem, KernelError
from shaperd.core.inventory import Capabilities, Inventory


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One write to one object on one device (or pseudo-device).

    Subclasses set ``verb`` (what an operator reads: create, change, delete,
    add, set) and implement ``what()`` (the object, in tc's words).
    """

    device: str
    ifindex: int
    reason: str = ""
    tenant: str | None = None

    verb: ClassVar[str] = "change"

    def what(self) -> str:  # pragma: no cover - every subclass names its object
        raise NotImplementedError

    @property
    def deletes(self) -> bool:
        """A delete whose object is already gone has reached its goal (ENOENT is success)."""
        return self.verb == "delete"

    def describe(self) -> str:
        tenant = f" (tenant {self.tenant})" if self.tenant else ""
        reason = f": {self.reason}" if self.reason else ""
        return f"{self.verb} {self.what()} on {self.device}{tenant}{reason}"

    def error(self, cause: str, errno: int | None = None) -> KernelError:
        """'verb object on device: cause', built from the operation itself."""
        return KernelError(self.verb, self.what(), self.device, cause, errno)


@dataclass
class TargetDiff:
    """The operations for one target (a device, or a backend's pseudo-device), in order."""

    target: str
    ops: list[Operation] = field(default_factory=list)
    # Set when the target is deliberately left alone (it is not shaperd's): why.
    blocked: str | None = None
    # Set when the target could not be read, so nothing was diffed: the error.
    error: str | None = None
    # Set when something is deliberately left in place that may not be shaperd's (a shared clsact that holds
    # another agent's filters): said once, never a failure.
    note: str | None = None


def planned_diffs(devices, observed, diff_one) -> list[TargetDiff]:
    """One TargetDiff per planned device (``.device``, ``.ifindex``) of a tc backend: the observation's
    read error, "gone", or ``diff_one(plan, state)``. ``observed`` has ``errors`` and ``devices`` by ifindex."""
    out = []
    for dp in devices:
        if dp.ifindex in observed.errors:
            out.append(TargetDiff(dp.device, error=observed.errors[dp.ifindex]))
            continue
        st = observed.devices.get(dp.ifindex)
        if st is None:
            out.append(TargetDiff(dp.device, error=f"read device {dp.device}: it is gone"))
            continue
        out.append(diff_one(dp, st))
    return out


@dataclass
class ApplyResult:
    applied: list[Operation] = field(default_factory=list)
    failed: list[tuple[Operation, KernelError]] = field(default_factory=list)
    # A batch that failed part-way: some writes may have landed; re-read and re-diff.
    batch_failed: bool = False


@dataclass(frozen=True)
class Support:
    """A backend's probe result: whether it runs here, and what an operator should know."""

    enabled: bool = True
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClassTarget:
    """What one shaping class on one device is for (the metrics sampler's labels and targets)."""

    tenant: str
    device: str
    classid: int
    guarantee_bps: int | None = None
    limit_bps: int | None = None
    # A capped pod's own class: its "namespace/name" (tenant "" for a pod of no tenant); "" for a tenant's.
    pod: str = ""


@dataclass
class BackendStats:
    """A backend's contribution to status and metrics."""

    # (device, classid) -> what that class enforces: the sampler reads its counters.
    targets: dict[tuple[str, int], ClassTarget] = field(default_factory=dict)
    # tenant -> endpoint kind ("cidr", "interface", "cgroup") -> number enforced now.
    endpoints: dict[str, dict[str, int]] = field(default_factory=dict)
    # Devices this backend enforces on (for logs and status).
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanInput:
    """What every backend plans from: the tenants file, the node, and who is who on it."""

    config: Config
    inventory: Inventory
    tenancy: Any  # shaperd.core.tenancy.Tenancy
    # backend name -> {device: (ifindex, reason)}: what a backend's apply found this kernel refuses there
    # (its ``refused(inv)``, remembered in memory by the backend, forgotten on restart). Data, not state.
    refused: dict = field(default_factory=dict)


class Desired(Protocol):
    """A backend's desired state. Problems: targets that cannot be enforced as configured."""

    problems: tuple[ConfigProblem, ...]
    warnings: tuple[str, ...]


class Backend(Protocol):
    name: str

    def probe(self, caps: Capabilities) -> Support: ...

    def plan(self, ctx: PlanInput) -> Desired: ...

    def observe(self, reads, inv: Inventory) -> Any: ...

    def diff(self, desired: Desired, observed: Any) -> list[TargetDiff]: ...

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult: ...

    def stats(self, desired: Desired) -> BackendStats: ...

    def teardown(self, observed: Any) -> list[TargetDiff]:
        """Every target found, against "nothing desired": removals, or ``error`` where unreadable (pure)."""
        ...


# ---------------------------------------------------------------- the registry's entries


@dataclass(frozen=True)
class NodeContext:
    """What a backend's factory builds from: one node (one network namespace) and its writers.

    ``writer``: kernel/tc.TcWriter (tc and rtnetlink writes) or None where nothing is written (status);
    ``classifier_pins``: the map classifier's bpffs PinStore, or None (its maps found by id);
    ``capabilities``: the probe's answer (a backend may derive its own pin store from it)."""

    writer: Any = None
    roots: Any = None  # shaperd.core.roots.Roots
    netns: str | None = None
    take_over: bool = False
    classifier_pins: Any = None
    capabilities: Capabilities | None = None


@dataclass(frozen=True)
class StatusInput:
    """What a backend's ``shaperd status`` section reads from (the command's arguments, resolved).

    ``config``: the tenants file, or None when it is not readable; ``diff_one(backend, config)``: the
    engine's plan-and-diff of that one backend without writing (sections never import the engine)."""

    config: Config | None
    config_path: str | None
    roots: Any
    netns: str | None = None
    bpffs_root: str = ""
    run_root: str = "/run"
    diff_one: Callable | None = None
    # backend name -> {device: {"reason": ...}}: what the applying process found this kernel refuses
    # (engine/refusals_file.py), read for the sections by the status frame.
    refused: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BackendSpec:
    """Everything the engine, the kernel writer, status, top, metrics and the command line need to know
    about one backend. A backend package exports one, ``SPEC`` in its ``spec.py``; shaperd/engine/registry.py
    lists them, and nothing else names a backend.

    - ``factory(NodeContext) -> Backend``; ``order``: the reconcile order (lower first);
    - ``codec``: its tc encoders (kernel/tc.Codec) for the node's writer, or None;
    - ``program_checks``: kernel/probe.ProgramChecks fields it supplies (its eBPF programs to try);
    - ``commands(rdma_subparsers, node_opts)``: its ``shaperd rdma ...`` subcommands, or None;
    - ``metrics(metrics, backend, job)``: add its Prometheus collector for a running ``backend`` (``job()``
      returns its background job or None);
    - ``job(netns, capabilities) -> Job``: a background loop the daemon runs (``update(desired)``: the
      desired state after each reconcile, ``stop()``), or None;
    - ``status(StatusInput) -> [section]``: its ``shaperd status`` sections (each ``order``, ``sample(reader)``,
      ``doc(window) -> dict``, ``render(window_doc) -> str``, ``errors() -> list[str]``, ``close()``);
    - ``top(StatusInput) -> plane``: its ``shaperd top`` plane (``name``, ``sample(reader) -> (stats, targets)``,
      ``backlog(key) -> (text, bytes, ns)``, ``errors() -> dict``, ``close()``), or None.
    """

    name: str
    factory: Callable[[NodeContext], Any]
    order: int = 50
    codec: Any = None
    program_checks: dict = field(default_factory=dict)
    commands: Callable | None = None
    metrics: Callable | None = None
    job: Callable | None = None
    status: Callable | None = None
    top: Callable | None = None


class StatusSection:
    """Base of a ``shaperd status`` section (a spec's ``status`` returns these): the no-ops most need.

    ``order``: its place in the output; ``key``: its key in -o json. The frame (report/status.py) calls
    ``sample(reader)`` at both ends of the window, then ``collect(reader) -> dict`` (its keys; {} when it
    has nothing here), ``render(window_doc) -> str`` ("" for nothing), ``errors()`` (devices it could not
    read: status exits 1) and, at the end, ``close()``."""

    order = 50
    key = ""

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        return {}

    def render(self, doc: dict) -> str:
        return ""

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class KeyedSection(StatusSection):
    """A section that is one key of the document: ``read(reader)`` gives its value or None (nothing on
    this node: no key, no text); ``lines(value)`` its text."""

    def read(self, reader):  # pragma: no cover - every subclass reads something
        raise NotImplementedError

    def lines(self, value) -> list[str]:  # pragma: no cover - every subclass renders
        raise NotImplementedError

    def collect(self, reader) -> dict:
        value = self.read(reader)
        return {self.key: value} if value is not None else {}

    def render(self, doc: dict) -> str:
        return "\n".join(self.lines(doc[self.key])) if self.key in doc else ""
