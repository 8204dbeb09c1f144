"""What the tenants file asks for that the node cannot give becomes plan warnings (Reconciler.unmet), and
only that: a disabled backend nothing needs is silent, in the plan and in the log."""

from __future__ import annotations

from dataclasses import dataclass

from structlog.testing import capture_logs

from shaperd.core import config
from shaperd.core.inventory import Capabilities
from shaperd.core.protocol import Support, TargetDiff
from shaperd.core.roots import Roots
from shaperd.engine.reconciler import Reconciler
from shaperd.kernel.rtnl_rows import LinkRow

CFG = config.load_text("""
node: {interfaces: [eth0], capacity: 1Gbps}
tenants:
  - {name: a, bandwidthGuarantee: 100Mbps, priority: 1, match: {cgroups: [present.slice, absent.slice]}}
""")


class Reader:
    def links(self):
        return [LinkRow(2, "eth0", "", 1500, True)]

    def routes(self, family):
        return []


@dataclass
class Want:
    problems: tuple = ()
    warnings: tuple = ()


class Backend:
    """Enabled or not; ``needed``: None for a backend without ``wanted``, else what wanted() answers."""

    def __init__(self, name, enabled=True, needed=None):
        self.name, self.enabled, self.asked = name, enabled, []
        if needed is not None:
            self.wanted = lambda ctx: self.asked.append(ctx.config) or needed(ctx)

    def probe(self, caps):
        return Support(self.enabled, () if self.enabled else (f"{self.name}: not on this kernel",))

    def plan(self, ctx):
        return Want()

    def observe(self, reads, inv):
        return None

    def diff(self, desired, observed):
        return [TargetDiff(f"dev-{self.name}")]

    def stats(self, desired):
        from shaperd.core.protocol import BackendStats
        return BackendStats()


def reconciler(tmp_path, *backends, cgroups=True):
    rec = Reconciler(Reader(), list(backends), Capabilities(), roots=Roots.of(sys=tmp_path / "sys",
                                                                            proc=tmp_path / "proc"),
                     cgroup_root=(tmp_path / "cg") if cgroups else None)
    if cgroups:
        (tmp_path / "cg" / "present.slice").mkdir(parents=True)
    return rec


def test_a_disabled_backend_nothing_needs_is_silent_in_the_plan_and_the_log(tmp_path):
    quiet = Backend("quiet", enabled=False, needed=lambda ctx: False)
    with capture_logs() as logs:
        rec = reconciler(tmp_path, Backend("on"), quiet, cgroups=False)
        plan = rec.plan(CFG)
        rep = rec.diff(CFG)
    assert plan.warnings == () and rep.plan.warnings == ()
    assert quiet.asked == [CFG, CFG]  # asked with the tenants file, each time
    assert logs == []


def test_a_disabled_backend_the_tenants_file_needs_is_a_plan_warning(tmp_path):
    rec = reconciler(tmp_path, Backend("needed", enabled=False, needed=lambda ctx: bool(ctx.config.tenants)),
                     Backend("unasked", enabled=False), cgroups=False)
    assert rec.plan(CFG).warnings == ("needed backend disabled: needed: not on this kernel",
                                      "unasked backend disabled: unasked: not on this kernel")  # no wanted(): always
    assert rec.diff(CFG).plan.warnings == rec.plan(CFG).warnings


def test_a_failing_wanted_does_not_hide_that_a_backend_is_off(tmp_path):
    rec = reconciler(tmp_path, Backend("odd", enabled=False, needed=lambda ctx: 1 / 0), cgroups=False)
    assert rec.plan(CFG).warnings == ("odd backend disabled: odd: not on this kernel",)


def test_an_enabled_backend_is_never_asked(tmp_path):
    on = Backend("on", needed=lambda ctx: True)
    assert reconciler(tmp_path, on, cgroups=False).plan(CFG).warnings == () and on.asked == []


def test_a_cgroup_that_is_not_there_is_a_plan_warning_not_a_log_line(tmp_path):
    with capture_logs() as logs:
        rec = reconciler(tmp_path, Backend("on"))
        warnings = rec.plan(CFG).warnings
    assert warnings == (f"tenant a: cgroup absent.slice not found under {tmp_path / 'cg'}: not matched until it "
                        "exists",)
    assert [c.path for c in rec.inventory(CFG).cgroups] == ["present.slice"]
    assert logs == []


def test_marks_is_wanted_only_where_a_tenant_has_pods_here():
    from shaperd.backends.marks.backend import MarksBackend
    from shaperd.core.inventory import Inventory
    from shaperd.core.protocol import PlanInput
    from shaperd.core.tenancy import Tenancy

    b = MarksBackend(None)
    assert b.probe(Capabilities(bpf=False)).enabled is False  # the case wanted() is asked about
    assert b.wanted(PlanInput(CFG, Inventory(), Tenancy(pod_tenants={"uid-1": "a"}))) is True
    assert b.wanted(PlanInput(CFG, Inventory(), Tenancy())) is False
