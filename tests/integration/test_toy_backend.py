"""A backend is one folder plus one registry line: a toy backend, defined here and nowhere else, is seen by
plan, diff, apply, status, metrics and teardown once registered, and by none of them after.

The toy's "kernel" is a JSON file under the run root (one entry per tenant: its guarantee), so the
test needs no device of its own; everything around it is real: the CLI's commands in-process,
the engine, a fresh network namespace for the node's reads, the daemon's metrics installation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.core import GaugeMetricFamily

from shaperd.cli import main as cli
from shaperd.core.protocol import ApplyResult, BackendSpec, BackendStats, Operation, Support, TargetDiff
from shaperd.daemon.service import install_backend_metrics
from shaperd.engine.reconciler import default_backends
from shaperd.engine.registry import REGISTRY
from shaperd.kernel.tc import Codec

from .conftest import needs_root
from .test_core import MATCH, NODE, write

pytestmark = needs_root
TARGET = "(toy)"


@dataclass(frozen=True, kw_only=True)
class SetEntry(Operation):
    value: int
    verb: ClassVar[str] = "set"

    def what(self) -> str:
        return f"toy entry {self.tenant}={self.value}"


@dataclass(frozen=True, kw_only=True)
class DeleteEntry(Operation):
    verb: ClassVar[str] = "delete"

    def what(self) -> str:
        return f"toy entry {self.tenant}"


@dataclass(frozen=True)
class ToyPlan:
    entries: dict = field(default_factory=dict)
    problems: tuple = ()
    warnings: tuple = ()


class ToyBackend:
    """Desired: each tenant's guarantee in Mbit/s, kept in <run root>/toy.json."""

    name = "toy"

    def __init__(self, path: Path):
        self.path = path

    def probe(self, caps) -> Support:
        return Support()

    def plan(self, ctx) -> ToyPlan:
        return ToyPlan({t.name: t.guarantee_bps // 1_000_000 for t in ctx.config.tenants})

    def observe(self, reads, inv) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def diff(self, desired: ToyPlan, observed: dict) -> list[TargetDiff]:
        ops = [SetEntry(device=TARGET, ifindex=0, tenant=t, value=v)
               for t, v in sorted(desired.entries.items()) if observed.get(t) != v]
        ops += [DeleteEntry(device=TARGET, ifindex=0, tenant=t) for t in sorted(set(observed) - set(desired.entries))]
        return [TargetDiff(TARGET, ops)]

    def apply(self, diff: TargetDiff, batch: bool = True) -> ApplyResult:
        state = self.observe(None, None)
        for op in diff.ops:
            if isinstance(op, SetEntry):
                state[op.tenant] = op.value
            else:
                state.pop(op.tenant, None)
        self.path.write_text(json.dumps(state))
        return ApplyResult(applied=list(diff.ops))

    def stats(self, desired) -> BackendStats:
        return BackendStats(devices=(TARGET,))

    def teardown(self, observed: dict) -> list[TargetDiff]:
        return self.diff(ToyPlan(), observed)

    def render(self, desired: ToyPlan) -> str:
        return "".join(f"toy set {t} {v}\n" for t, v in sorted(desired.entries.items()))


class ToySection:
    order, key = 80, "toy"

    def __init__(self, inp):
        self.path = inp.roots.run / "toy.json"

    def sample(self, reader) -> None:
        pass

    def collect(self, reader) -> dict:
        return {"toy": json.loads(self.path.read_text())} if self.path.exists() else {}

    def render(self, doc: dict) -> str:
        return "\n".join(f"toy {t}: {v} Mbit/s" for t, v in sorted(doc.get("toy", {}).items()))

    def errors(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class ToyCollector:
    def __init__(self, backend):
        self.backend = backend

    def collect(self):
        g = GaugeMetricFamily("shaperd_toy_entries", "Entries in the toy backend's file")
        g.add_metric([], len(self.backend.observe(None, None)))
        yield g


TOY = BackendSpec(
    name="toy", order=99,
    factory=lambda ctx: ToyBackend(ctx.roots.run / "toy.json"),
    codec=Codec(encoders={SetEntry: lambda op, fd: None}),
    metrics=lambda metrics, backend, job: metrics.collectors.collectors.__setitem__("toy", ToyCollector(backend)),
    status=lambda inp: [ToySection(inp)],
)


@pytest.fixture
def node(bed, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "netns").symlink_to("/run/netns")  # the bed's namespaces, under this test's own run root
    cfg = write(tmp_path, NODE + MATCH)
    return ["--config", str(cfg), "--netns", bed.node, "--run-root", str(run), "--bpffs-root", ""], run


def shaperd(capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    got = capsys.readouterr()
    print(got.err)  # shown when the test fails
    return code, got.out


def test_a_toy_backend_registered_from_the_tests_alone_is_planned_applied_shown_scraped_and_torn_down(
        node, capsys):
    opts, run = node
    state = run / "toy.json"
    with REGISTRY.added(TOY):
        code, out = shaperd(capsys, "plan", *opts)
        assert code == 0 and "toy set tenant-a 40000" in out and "toy set tenant-b" in out
        code, out = shaperd(capsys, "diff", *opts)
        assert code == 1 and "would set toy entry tenant-a=40000 on (toy)" in out
        assert not state.exists()  # diff wrote nothing
        assert shaperd(capsys, "apply", *opts)[0] == 0
        assert json.loads(state.read_text()) == {"tenant-a": 40000, "tenant-b": 20000}
        code, out = shaperd(capsys, "diff", *opts)
        assert code == 0 and "would set toy" not in out  # in sync: no write pending for the toy either
        code, out = shaperd(capsys, "status", *opts, "--interval", "0")
        assert "toy tenant-a: 40000 Mbit/s" in out
        code, out = shaperd(capsys, "status", *opts, "--interval", "0", "-o", "json")
        assert json.loads(out)["toy"] == {"tenant-a": 40000, "tenant-b": 20000}
        from shaperd.report.metrics import Metrics

        metrics = Metrics(None)
        toy = next(b for b in default_backends(None, roots=_roots(run)) if b.name == "toy")
        install_backend_metrics(metrics, [toy], {})
        assert b"shaperd_toy_entries 2.0" in metrics.exposition()
        assert SetEntry in REGISTRY.codec().encoders  # the node's writer gets its encoders too
        assert shaperd(capsys, "teardown", *opts[2:])[0] == 0
        assert json.loads(state.read_text()) == {}
    code, out = shaperd(capsys, "plan", *opts)
    assert code == 0 and "toy set" not in out and REGISTRY.spec("toy") is None  # unregistered: gone again


def _roots(run: Path):
    from shaperd.core.roots import Roots

    return Roots.of(run=str(run))
