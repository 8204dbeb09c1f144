"""The startup taint against the fake API server (tests/k8s_fake.py): off after the first enforcing reconcile.

``shaperd run --remove-taint`` builds a daemon.taint.StartupTaint; the daemon calls ``enforced()``
after a reconcile that ran and in which nothing failed. Here the daemon's reconcile is driven with
fake reconcilers returning real engine Reports (as tests/unit/test_daemon_health.py does), the taint
remover talks HTTP to the fake API, and the node's taints are read back from the fake:

- not removed before the first enforcing reconcile (no tenants file, the first pod list not in,
  a reconcile that raised, one in which a write failed); removed after it, by one JSON patch that
  tests the taint at its index and removes it, every other taint kept;
- a concurrent edit of the taints between the read and the patch: the test op fails (422), the
  remover reads again and removes the taint at its new index;
- the taint absent: no write at all;
- the API down, refusing or hanging: each reconcile still runs and returns (the remover is a thread
  of its own), and once the API answers again the taint goes.

Waits are on conditions with deadlines; backoff delays are injected (no sleeping on a busy machine).
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from shaperd.cli import main as cli
from shaperd.core.errors import DiscoveryError
from shaperd.daemon import service
from shaperd.daemon.service import Daemon
from shaperd.daemon.taint import StartupTaint, parse_taint
from shaperd.discovery.kubernetes.backoff import Backoff
from shaperd.discovery.kubernetes.nodes import TaintRef

from ..k8s_fake import write_kubeconfig
from .test_daemon_health import CFG, FakeRec, report

NODE = "node-1"
TAINT = {"key": "shaperd.io/agent-not-ready", "effect": "NoSchedule"}
OTHER = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
DEADLINE_S = 30.0  # bounds a failure only


def wait_for(cond, deadline_s: float = DEADLINE_S) -> bool:
    end = time.monotonic() + deadline_s
    ev = threading.Event()
    while not cond():
        if time.monotonic() > end:
            return False
        ev.wait(0.02)
    return True


@pytest.fixture
def remover(api, tmp_path):
    """A StartupTaint for NODE pointed at the fake; backoff waits are recorded and cut short."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    made = []

    def make(**kw) -> StartupTaint:
        stop = threading.Event()
        waits: list[float] = []

        def wait(s: float) -> None:
            waits.append(s)
            stop.wait(0.01)

        kw.setdefault("request_timeout_s", 5.0)
        st = StartupTaint(NODE, TaintRef("shaperd.io/agent-not-ready"), kubeconfig=str(kubeconfig),
                          rng=random.Random(1), wait=wait, **kw)
        st.waits = waits
        made.append((st, stop))
        return st

    yield make
    for st, stop in made:
        stop.set()
        st.stop()


def daemon_with(st: StartupTaint, pods=None) -> Daemon:
    d = Daemon("/nonexistent", None, startup_taint=st)
    d.config = CFG
    d.pods = pods
    return d


def patch_ops(api) -> list[list[dict]]:
    return [json.loads(r["body"]) for r in api.node_patches()]


def test_the_taint_stays_until_a_reconcile_enforced_the_tenants_then_goes_in_one_guarded_patch(api, remover):
    api.add_node(NODE, taints=[OTHER, TAINT, GPU])
    st = remover()
    d = daemon_with(st)
    d.config = None
    d.reconcile(FakeRec(report()))  # no valid tenants file yet: nothing enforced
    d.config = CFG
    d.reconcile(FakeRec(DiscoveryError("read links: the netlink socket timed out")))  # did not run
    d.reconcile(FakeRec(report(failed=True)))  # ran, but a write was refused
    assert st.state == "waiting" and api.node_patches() == [] and api.accesses() == []
    assert api.node_taints(NODE) == [OTHER, TAINT, GPU]

    d.reconcile(FakeRec(report()))  # ran, nothing failed
    assert wait_for(st.done.is_set)
    assert st.state == "removed"
    assert api.node_taints(NODE) == [OTHER, GPU]
    assert patch_ops(api) == [[{"op": "test", "path": "/spec/taints/1", "value": TAINT},
                               {"op": "remove", "path": "/spec/taints/1"}]]
    assert [r["method"] for r in api.requests] == ["GET", "PATCH"]
    # Once: later enforcing reconciles (and a taint put back by hand) send nothing more.
    api.edit_node(NODE, lambda n: n["spec"]["taints"].append(dict(TAINT)))
    d.reconcile(FakeRec(report()))
    d.reconcile(FakeRec(report()))
    assert len(api.requests) == 2 and api.node_taints(NODE)[-1] == TAINT


def test_a_degraded_reconcile_enforced_what_it_could_and_lifts_the_taint(api, remover):
    api.add_node(NODE, taints=[TAINT])
    st = remover()
    daemon_with(st).reconcile(FakeRec(report(blocked=("v0",))))  # a foreign root qdisc left alone
    assert wait_for(st.done.is_set) and api.node_taints(NODE) == []


def test_not_before_the_first_pod_list(api, remover):
    class Unsynced:
        has_synced = synced = False
        last_error = "connection refused"

        def snapshot(self):
            return {}

    api.add_node(NODE, taints=[TAINT])
    st = remover()
    d = daemon_with(st, pods=Unsynced())
    d.reconcile(FakeRec(report()))
    assert st.state == "waiting" and api.requests == []


def test_a_concurrent_edit_of_the_taints_fails_the_test_op_and_is_read_again(api, remover):
    api.add_node(NODE, taints=[TAINT])
    edits = []

    def someone_else_taints_first(fake, name):
        if not edits:  # between our read and our first patch: a new taint lands at index 0
            edits.append(fake.edit_node(name, lambda n: n["spec"]["taints"].insert(0, GPU)))

    api.before_node_patch = someone_else_taints_first
    st = remover()
    st.enforced()
    assert wait_for(st.done.is_set) and st.state == "removed"
    assert api.node_taints(NODE) == [GPU]  # theirs kept, ours gone
    assert patch_ops(api) == [
        [{"op": "test", "path": "/spec/taints/0", "value": TAINT}, {"op": "remove", "path": "/spec/taints/0"}],
        [{"op": "test", "path": "/spec/taints/1", "value": TAINT}, {"op": "remove", "path": "/spec/taints/1"}]]
    assert [r["method"] for r in api.requests] == ["GET", "PATCH", "GET", "PATCH"]
    assert st.waits == []  # a conflict is read again at once, not backed off


def test_an_absent_taint_is_no_write(api, remover):
    api.add_node(NODE, taints=[GPU])
    st = remover()
    st.enforced()
    assert wait_for(st.done.is_set) and st.state == "absent"
    assert [r["method"] for r in api.requests] == ["GET"] and api.node_taints(NODE) == [GPU]
    api.add_node("node-2", taints=None)  # no spec.taints at all
    st2 = StartupTaint("node-2", TaintRef("shaperd.io/agent-not-ready"), client_configuration=st._cfg)
    st2.enforced()
    assert wait_for(st2.done.is_set) and st2.state == "absent" and api.node_patches() == []


def test_api_errors_are_retried_with_backoff_and_enforcement_goes_on(api, remover):
    api.add_node(NODE, taints=[TAINT])
    api.fail_status = 500
    st = remover()
    d = daemon_with(st)
    rec = FakeRec(report())
    assert d.reconcile(rec) is None
    assert wait_for(lambda: len(st.waits) >= 3)
    # The waits follow the watchers' backoff (seeded jitter), doubling.
    rng = random.Random(1)
    assert st.waits[:3] == pytest.approx([Backoff().delay_s(i, rng) for i in range(3)])
    for _ in range(3):  # the loop keeps reconciling meanwhile
        assert d.reconcile(rec) is None
    assert d.reconciles == 4 and d.failures == 0 and st.state == "removing"
    assert "HTTP 500" in st.last_error and f"node {NODE}" in st.last_error
    api.fail_status = None
    assert wait_for(st.done.is_set) and api.node_taints(NODE) == []


def test_a_down_then_hanging_api_never_blocks_a_reconcile(api, remover):
    api.add_node(NODE, taints=[TAINT])
    api.hang()  # every request waits without an answer (until its 60 s deadline)
    st = remover(request_timeout_s=60.0)
    d = daemon_with(st)
    rec = FakeRec(report())
    assert d.reconcile(rec) is None  # returns although the remover's GET hangs
    assert wait_for(lambda: len(api.requests) == 1)
    assert d.reconcile(rec) is None and d.reconciles == 2 and not st.done.is_set()
    api.hang(False)
    assert wait_for(st.done.is_set) and api.node_taints(NODE) == []


def test_an_api_server_that_is_gone_is_retried_until_it_is_back(api, remover):
    api.add_node(NODE, taints=[TAINT])
    api.go_down()
    st = remover()
    daemon_with(st).reconcile(FakeRec(report()))
    assert wait_for(lambda: len(st.waits) >= 2)
    assert "node node-1" in st.last_error
    api.come_back()
    assert wait_for(st.done.is_set) and st.state == "removed" and api.node_taints(NODE) == []


def test_stop_ends_a_remover_that_is_still_retrying(api, tmp_path):
    api.add_node(NODE, taints=[TAINT])
    api.fail_status = 503
    st = StartupTaint(NODE, TaintRef("shaperd.io/agent-not-ready"),
                      kubeconfig=str(write_kubeconfig(tmp_path / "kc", api.url)), rng=random.Random(2))
    st.enforced()
    assert wait_for(lambda: st.attempts >= 1 and st.last_error is not None)
    st.stop(timeout_s=DEADLINE_S)  # the backoff wait is the stop event's: it ends at once
    assert st._thread is not None and not st._thread.is_alive() and st.state == "stopped"
    st.enforced()  # stopped: never started again
    assert not st._thread.is_alive()


def test_the_taint_argument():
    assert parse_taint("shaperd.io/agent-not-ready") == TaintRef("shaperd.io/agent-not-ready", "NoSchedule")
    assert parse_taint("shaperd.io/agent-not-ready:NoExecute") == TaintRef("shaperd.io/agent-not-ready", "NoExecute")
    for bad in ("", ":NoSchedule", "k:Sometimes", "k=v:NoSchedule"):
        with pytest.raises(ValueError):
            parse_taint(bad)


def test_the_metric_says_when_the_taint_is_off(api, remover):
    from prometheus_client.registry import CollectorRegistry

    api.add_node(NODE, taints=[TAINT])
    st = remover()
    reg = CollectorRegistry()
    reg.register(st.collector())
    labels = {"taint": "shaperd.io/agent-not-ready:NoSchedule"}
    assert reg.get_sample_value("shaperd_startup_taint_removed", labels) == 0.0
    st.enforced()
    assert wait_for(st.done.is_set)
    assert reg.get_sample_value("shaperd_startup_taint_removed", labels) == 1.0


class _Built:
    seen: dict = {}

    def __init__(self, config, make_reconciler, **kw):
        _Built.seen = kw

    def run(self) -> int:
        return 0


def test_run_builds_the_remover_from_the_flag_and_refuses_it_without_kubernetes(api, tmp_path, monkeypatch, capsys):
    import structlog

    monkeypatch.setattr(service, "Daemon", _Built)
    kc = str(write_kubeconfig(tmp_path / "kc", api.url))
    saved = structlog.get_config()
    try:
        monkeypatch.setenv("NODE_NAME", NODE)
        assert cli.main(["run", "--remove-taint", "shaperd.io/agent-not-ready:NoSchedule", "--kubeconfig", kc,
                         "--metrics-address", "", "--no-pod-resources"]) == 0
        st = _Built.seen["startup_taint"]
        assert isinstance(st, StartupTaint) and st.node_name == NODE
        assert st.taint == TaintRef("shaperd.io/agent-not-ready", "NoSchedule")
        assert cli.main(["run", "--kubeconfig", kc, "--metrics-address", ""]) == 0
        assert _Built.seen["startup_taint"] is None
        assert cli.main(["run", "--remove-taint", "shaperd.io/agent-not-ready", "--no-kubernetes",
                         "--metrics-address", ""]) == 2
        assert "--remove-taint shaperd.io/agent-not-ready:NoSchedule: needs this node's name" in capsys.readouterr().err
    finally:
        structlog.configure(**saved)
