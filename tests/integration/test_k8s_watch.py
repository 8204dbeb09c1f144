"""PodWatcher against a fake API server, through shaperd's own client (no root).

Every test gets its own fake server, kubeconfig and watcher, stopped even
when the test fails. Nothing here depends on how fast the machine is:

- waits are on conditions, with a deadline (DEADLINE) that only bounds a
  failure;
- the backoff schedule is asserted as the delays the watcher asked for
  (an injected ``wait`` records them), not as measured gaps;
- "X must not happen" is made observable: ``Changes`` records the
  watcher's resourceVersion at every on_change call, and the test waits
  until a later event (a sentinel) was processed before it asserts which
  calls there were. The watcher applies events in order on one thread, so
  a call for the earlier event would already be on record.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from shaperd.discovery.kubernetes import Backoff, KubernetesConfigError, PodWatcher, load_client_config
from tests.k8s_fake import FakeKubeAPI, make_pod, write_kubeconfig

NODE = "gpu-node-7"
DEADLINE = 30.0  # seconds; bounds a failure only, a passing run never waits for it
FAST = Backoff(initial_s=0.05, max_s=0.5)


class Changes:
    """on_change: records the watcher's resourceVersion at each call."""

    def __init__(self):
        self.watcher: PodWatcher | None = None
        self.rvs: list[str | None] = []
        self.cond = threading.Condition()

    def __call__(self):
        with self.cond:
            self.rvs.append(self.watcher.resource_version if self.watcher else None)
            self.cond.notify_all()

    def wait_rv(self, rv: str | int, timeout: float = DEADLINE) -> bool:
        """Until on_change was called for the event at version ``rv``."""
        with self.cond:
            return self.cond.wait_for(lambda: str(rv) in self.rvs, timeout)


def wait(pred, timeout: float = DEADLINE) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


def rv(obj: dict) -> str:
    return obj["metadata"]["resourceVersion"]


def at_least(w: PodWatcher, version: str | int) -> bool:
    """The watcher has processed everything up to ``version``."""
    return w.resource_version is not None and int(w.resource_version) >= int(version)


@pytest.fixture
def api():
    fake = FakeKubeAPI()
    yield fake
    fake.close()


@pytest.fixture
def make_watcher(api, tmp_path):
    made = []
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)

    def make(node=NODE, watch_timeout_s=30, request_timeout_s=10.0, backoff=FAST, **kw):
        changes = Changes()
        w = PodWatcher(node, changes, kubeconfig=str(kubeconfig), request_timeout_s=request_timeout_s,
                       watch_timeout_s=watch_timeout_s, backoff=backoff, **kw)
        changes.watcher = w
        made.append(w)
        w.start()
        return w, changes

    yield make
    for w in made:
        w.stop()


def names(w: PodWatcher) -> set[str]:
    return {p.name for p in w.snapshot().values()}


def test_list_then_watch_add_modify_delete(api, make_watcher):
    a = api.add_pod(make_pod("a", NODE, labels={"tenant": "blue"}))
    api.add_pod(make_pod("elsewhere", "other-node"))
    listed = api.rv
    w, changes = make_watcher()
    assert changes.wait_rv(listed)  # the initial list
    assert names(w) == {"a"} and w.synced

    b = api.add_pod(make_pod("b", NODE, ips=("10.0.0.2", "fd00::2"), qos="Guaranteed"))
    assert changes.wait_rv(rv(b))
    pb = w.snapshot()[b["metadata"]["uid"]]
    assert pb.ips == ("10.0.0.2", "fd00::2") and pb.qos_class == "Guaranteed" and pb.node == NODE

    relabelled = api.set_labels(a["metadata"]["uid"], {"tenant": "red"})
    assert changes.wait_rv(rv(relabelled))
    assert w.snapshot()[a["metadata"]["uid"]].labels == {"tenant": "red"}

    deleted = api.delete_pod(b["metadata"]["uid"])
    assert changes.wait_rv(deleted)
    assert names(w) == {"a"}

    # a pod on another node changes: nothing reaches us. The sentinel after it proves
    # the watcher got past it; the record shows one call per change, none for c.
    api.add_pod(make_pod("c", "other-node"))
    d = api.add_pod(make_pod("d", NODE))
    assert changes.wait_rv(rv(d))
    assert changes.rvs == [str(listed), rv(b), rv(relabelled), str(deleted), rv(d)]
    assert names(w) == {"a", "d"}


def test_modified_that_shaperd_ignores_does_not_call_on_change(api, make_watcher):
    a = api.add_pod(make_pod("a", NODE))
    listed = api.rv
    w, changes = make_watcher()
    assert changes.wait_rv(listed)
    ignored = api.modify_pod(a["metadata"]["uid"], lambda p: p["status"].__setitem__("conditions", [{"type": "Ready"}]))
    assert wait(lambda: at_least(w, rv(ignored)))  # processed: the watcher is at its version
    finished = api.modify_pod(a["metadata"]["uid"], lambda p: p["status"].__setitem__("phase", "Succeeded"))
    assert changes.wait_rv(rv(finished))
    assert changes.rvs == [str(listed), rv(finished)]  # no call for the condition change
    assert w.snapshot()[a["metadata"]["uid"]].phase == "Succeeded"


EGRESS = "kubernetes.io/egress-bandwidth"


def set_annotation(key: str, value):
    def fn(p):
        ann = p["metadata"].setdefault("annotations", {})
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value
    return fn


def test_a_changed_bandwidth_annotation_notifies_an_unrelated_one_does_not(api, make_watcher):
    """Live caps: a MODIFIED event that changes only kubernetes.io/egress-bandwidth reaches the reconcile
    (no pod restart); one that changes an unrelated annotation does not wake it."""
    a = api.add_pod(make_pod("a", NODE))
    uid = a["metadata"]["uid"]
    listed = api.rv
    w, changes = make_watcher()
    assert changes.wait_rv(listed)
    capped = api.modify_pod(uid, set_annotation(EGRESS, "100M"))
    assert changes.wait_rv(rv(capped))
    assert w.snapshot()[uid].annotations[EGRESS] == "100M"
    unrelated = api.modify_pod(uid, set_annotation("example.com/build", "42"))
    assert wait(lambda: at_least(w, rv(unrelated)))  # processed, without a call
    changed = api.modify_pod(uid, set_annotation(EGRESS, "200M"))
    assert changes.wait_rv(rv(changed))
    assert w.snapshot()[uid].annotations[EGRESS] == "200M"
    removed = api.modify_pod(uid, set_annotation(EGRESS, None))  # a removed annotation removes the cap
    assert changes.wait_rv(rv(removed))
    assert EGRESS not in w.snapshot()[uid].annotations
    assert changes.rvs == [str(listed), rv(capped), rv(changed), rv(removed)]


def test_field_selector_and_node_name_reach_the_server(api, make_watcher):
    w, _ = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    lst, wat = api.list_requests()[0], api.watch_requests()[0]
    assert lst["path"] == wat["path"] == "/api/v1/pods"
    assert lst["query"]["fieldSelector"] == wat["query"]["fieldSelector"] == f"spec.nodeName={NODE}"
    assert wat["query"]["allowWatchBookmarks"] == "true"
    assert wat["query"]["timeoutSeconds"] == "30"
    assert wat["resourceVersion"] == str(api.rv)  # watches from the list's version


def test_bookmark_advances_the_version_a_reconnect_uses(api, make_watcher):
    api.add_pod(make_pod("a", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    api.unrelated_writes(7)  # other nodes' pods: the global version moves, we see no event
    bm = api.bookmark()
    assert wait(lambda: w.resource_version == str(bm))
    before = len(api.watch_requests())
    api.drop_watches()
    assert wait(lambda: len(api.watch_requests()) > before)
    assert api.watch_requests()[-1]["resourceVersion"] == str(bm)
    b = api.add_pod(make_pod("b", NODE))
    assert changes.wait_rv(rv(b))  # the resumed watch delivers
    assert len(api.list_requests()) == 1  # resumed, not relisted


def test_watch_timeout_resumes_from_last_version(api, make_watcher):
    w, changes = make_watcher(watch_timeout_s=1)
    assert wait(lambda: w.synced)
    a = api.add_pod(make_pod("a", NODE))
    assert wait(lambda: len(api.watch_requests()) >= 2)  # the server ended the first watch after 1 s
    assert api.watch_requests()[1]["resourceVersion"] == rv(a)
    assert len(api.list_requests()) == 1 and w.synced


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
def test_410_relists_and_forgets_pods_deleted_in_the_gap(api, make_watcher, gone_as_http):
    api.gone_as_http = gone_as_http
    a = api.add_pod(make_pod("a", NODE))
    b = api.add_pod(make_pod("b", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    api.hang()  # the watch goes silent (the fake sends nothing more once this returns) ...
    api.delete_pod(b["metadata"]["uid"])  # ... while b is deleted
    c = api.add_pod(make_pod("c", NODE))
    api.compact()  # and history is compacted past our version
    api.drop_watches()
    api.hang(False)
    assert wait(lambda: names(w) == {"a", "c"})
    assert w.synced
    lists = api.list_requests()
    assert len(lists) == 2
    assert lists[0]["resourceVersion"] == "0"  # first list from the watch cache
    assert lists[1]["resourceVersion"] is None  # after 410: a consistent read, no time travel
    assert a["metadata"]["uid"] in w.snapshot() and c["metadata"]["uid"] in w.snapshot()


def test_server_down_keeps_snapshot_then_recovers(api, make_watcher):
    delays: list[float] = []

    def spaced(d: float) -> None:  # the real spacing, recorded
        delays.append(d)
        time.sleep(d)

    api.add_pod(make_pod("a", NODE))
    w, changes = make_watcher(wait=spaced, backoff=Backoff(initial_s=0.05, max_s=0.5, jitter=0.0))
    assert wait(lambda: w.synced and api.watch_requests())
    assert delays == []
    api.go_down()
    assert wait(lambda: not w.synced)
    assert names(w) == {"a"} and w.has_synced  # last known state is still served
    assert "Connection refused" in (w.last_error or "") or "watch pods" in (w.last_error or "")
    # Three failed reconnects while down, spaced further and further apart, not a tight loop;
    # the cache is kept through all of them.
    assert wait(lambda: len(delays) >= 4)
    assert delays[:3] == [0.05, 0.1, 0.2]
    assert not w.synced and names(w) == {"a"}
    api.come_back()
    b = api.add_pod(make_pod("b", NODE))
    assert changes.wait_rv(rv(b))
    assert w.synced and w.last_error is None
    assert b["metadata"]["uid"] in w.snapshot()
    # resumed the watch from the version it had, no relist needed
    assert len(api.list_requests()) == 1


def test_reconnects_back_off_exponentially(api, tmp_path):
    """While the server is down, each attempt waits longer (x2 up to the cap), jittered from the rng."""
    api.go_down()
    kubeconfig = write_kubeconfig(tmp_path / "kc", api.url)
    backoff = Backoff(initial_s=0.05, max_s=0.4, jitter=0.5)
    delays: list[float] = []
    enough = threading.Event()

    def record(d: float) -> None:  # no real waiting: the schedule is what is under test
        delays.append(d)
        if len(delays) >= 8:
            enough.set()
            time.sleep(0.01)  # until stop(): do not spin on a server that is down

    w = PodWatcher(NODE, lambda: None, kubeconfig=str(kubeconfig), request_timeout_s=10,
                   backoff=backoff, rng=random.Random(42), wait=record)
    w.start()
    try:
        assert enough.wait(DEADLINE)
    finally:
        w.stop()
    rng = random.Random(42)
    assert delays[:8] == [backoff.delay_s(i, rng) for i in range(8)]
    ceilings = [0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))
    assert not w.synced and not w.has_synced and w.snapshot() == {}


def test_a_watch_that_lived_restarts_the_backoff(api, make_watcher):
    """Watches cut young: the backoff climbs. One that lived PROGRESS_AFTER_S (on the injected
    clock) before it was cut: the next delay starts from the beginning again."""
    from shaperd.discovery.kubernetes.watcher import PROGRESS_AFTER_S

    now = [1000.0]
    delays: list[float] = []
    w, _ = make_watcher(backoff=Backoff(initial_s=0.05, max_s=0.4, jitter=0.0), clock=lambda: now[0],
                        wait=delays.append)
    assert wait(lambda: w.synced and len(api.watch_requests()) == 1)
    for i, advance in enumerate((0.0, 0.0, PROGRESS_AFTER_S)):
        now[0] += advance  # the open watch's age on the watcher's clock
        api.drop_watches()
        assert wait(lambda: len(delays) >= i + 1 and len(api.watch_requests()) >= i + 2)
    assert delays == [0.05, 0.1, 0.05]
    assert len(api.list_requests()) == 1


def test_garbage_line_resumes_from_last_good_version(api, make_watcher):
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    a = api.add_pod(make_pod("a", NODE))
    assert wait(lambda: names(w) == {"a"})
    before = len(api.watch_requests())
    api.garbage("<html>502 Bad Gateway</html>")
    b = api.add_pod(make_pod("b", NODE))
    assert wait(lambda: names(w) == {"a", "b"})
    # the stream was abandoned at the garbage and resumed from a's version, so b was not lost
    assert api.watch_requests()[before]["resourceVersion"] == rv(a)
    assert wait(lambda: w.synced)
    assert b["metadata"]["uid"] in w.snapshot()


def test_poison_line_in_history_leads_to_a_relist(api, make_watcher):
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    a = api.add_pod(make_pod("a", NODE))
    api.garbage("{{{ truncated", persistent=True)  # replayed to every watch resuming before it
    b = api.add_pod(make_pod("b", NODE))
    assert wait(lambda: names(w) == {"a", "b"})
    assert wait(lambda: w.synced)
    lists = api.list_requests()
    assert len(lists) == 2 and lists[1]["resourceVersion"] is None
    assert a["metadata"]["uid"] in w.snapshot() and b["metadata"]["uid"] in w.snapshot()


def test_malformed_pods_are_skipped_others_applied(api, make_watcher):
    bad_list = make_pod("bad-in-list", NODE)
    bad_list["metadata"]["labels"] = ["not", "a", "map"]
    api.add_pod(bad_list)
    api.add_pod(make_pod("good-in-list", NODE))
    listed = api.rv
    w, changes = make_watcher()
    assert changes.wait_rv(listed)
    assert names(w) == {"good-in-list"}

    bad_ip = make_pod("bad-ip", NODE, ips=("not-an-ip",))
    api.raw_event("ADDED", bad_ip)
    no_uid = make_pod("no-uid", NODE)
    del no_uid["metadata"]["uid"]
    api.raw_event("ADDED", no_uid)
    api.raw_event("ADDED", "a string, not a pod")  # valid JSON, not an object
    host = api.add_pod(make_pod("good-after", NODE, host_network=True, ips=("192.0.2.10",)))
    assert changes.wait_rv(rv(host))
    assert names(w) == {"good-in-list", "good-after"}
    assert w.snapshot()[host["metadata"]["uid"]].host_network is True
    assert changes.rvs == [str(listed), rv(host)]  # the three bad events called nobody

    # a pod that turns malformed keeps its last good entry; a later good event applies
    uid = host["metadata"]["uid"]
    bad = api.modify_pod(uid, lambda p: p["spec"].__setitem__("hostNetwork", "yes"))
    assert wait(lambda: at_least(w, rv(bad)))
    assert w.snapshot()[uid].host_network is True and w.synced

    def repair(p):
        p["spec"]["hostNetwork"] = True
        p["metadata"]["labels"] = {"tenant": "x"}
    fixed = api.modify_pod(uid, repair)
    assert changes.wait_rv(rv(fixed))
    assert w.snapshot()[uid].labels == {"tenant": "x"} and w.snapshot()[uid].host_network is True
    assert changes.rvs == [str(listed), rv(host), rv(fixed)]  # none for the malformed version


def test_hanging_server_does_not_block_stop(api, make_watcher):
    w, changes = make_watcher(request_timeout_s=30.0)
    assert wait(lambda: w.synced and api.watch_requests())
    calls = len(changes.rvs)
    api.hang()
    api.drop_watches()  # the reconnect now waits on a server that never answers (for up to 60 s)
    assert wait(lambda: len(api.watch_requests()) >= 2)
    stopper = threading.Thread(target=w.stop, kwargs={"timeout_s": 0.5}, daemon=True)
    stopper.start()
    stopper.join(DEADLINE)
    assert not stopper.is_alive()  # stop() returned ...
    assert w._thread.is_alive() and not w.synced  # ... and abandoned the request still open
    # The abandoned request changes nothing when the server answers after all.
    api.hang(False)
    late = api.add_pod(make_pod("late", NODE))
    w._thread.join(DEADLINE)
    assert not w._thread.is_alive()
    assert late["metadata"]["uid"] not in w.snapshot()
    assert not w.synced and len(changes.rvs) == calls


def test_stop_during_open_watch_ends_the_thread(api, make_watcher):
    """The watch is cut at the socket: the thread ends instead of reading until the server's
    timeout (300 s here, far beyond the join)."""
    w, _ = make_watcher(watch_timeout_s=300, request_timeout_s=30.0)
    assert wait(lambda: w.synced and api.watch_requests())
    w.stop(timeout_s=DEADLINE)
    assert not w._thread.is_alive()
    assert not w.synced


def test_hanging_list_is_given_up_after_request_timeout(api, make_watcher):
    api.hang()
    w, _ = make_watcher(request_timeout_s=0.5)
    assert wait(lambda: w.last_error is not None)
    assert "list pods on node" in w.last_error and "timed out" in w.last_error.lower()
    assert not w.has_synced
    api.hang(False)
    assert wait(lambda: w.synced)


def test_load_client_config(tmp_path, monkeypatch, api):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(KubernetesConfigError, match="no such file"):
        load_client_config(None)
    kc = write_kubeconfig(tmp_path / "kc", api.url)
    monkeypatch.setenv("KUBECONFIG", str(kc))
    assert load_client_config(None).host == api.url
    (tmp_path / "broken").write_text("clusters: [")
    with pytest.raises(KubernetesConfigError, match="broken"):
        load_client_config(str(tmp_path / "broken"))
    # in a pod without a mounted service account: a clear error, not a traceback
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubernetesConfigError, match="in-cluster"):
        load_client_config(None)
    # an explicit kubeconfig still wins inside a pod
    assert load_client_config(str(kc)).host == api.url


def test_stop_between_response_and_stream_still_cuts_the_watch(api, tmp_path, monkeypatch):
    """stop() that lands after the watch's headers arrived but before the library kept the
    response still ends the thread: without the cut it would read until the server's
    timeout (300 s here)."""
    from shaperd.discovery.kubernetes.api import CoreV1

    kubeconfig = write_kubeconfig(tmp_path / "kc", api.url)
    w = PodWatcher(NODE, lambda: None, kubeconfig=str(kubeconfig), request_timeout_s=10, watch_timeout_s=300)
    orig = CoreV1.list_pod_for_all_namespaces
    stopper: list[threading.Thread] = []

    def list_then_stop(self, **kw):
        resp = orig(self, **kw)
        if kw.get("watch") and not stopper:
            t = threading.Thread(target=w.stop, kwargs={"timeout_s": DEADLINE}, daemon=True)
            t.start()
            stopper.append(t)  # published only once started: the test thread joins it as soon as it sees it
            assert w._stop.wait(DEADLINE)  # stop() has begun; the watcher has not published resp yet
        return resp

    monkeypatch.setattr(CoreV1, "list_pod_for_all_namespaces", list_then_stop)
    w.start()
    try:
        assert wait(lambda: stopper)
        stopper[0].join(DEADLINE)
        assert not stopper[0].is_alive() and not w._thread.is_alive()
    finally:
        w.stop()


def test_a_rotated_token_file_is_used_on_the_next_connection_and_a_401_heals(api, tmp_path):
    """The bound-token shape: the kubelet renames a new token over the old file. The next request
    (here: the reconnect after the server drops the watch) carries it; a 401 (the server moved on
    before the file did) is retried with backoff, not fatal, until the file catches up."""
    import os

    import yaml

    token = tmp_path / "token"

    def rotate(value: str) -> None:
        (tmp_path / "token.new").write_text(value)
        os.replace(tmp_path / "token.new", token)

    rotate("t1")
    api.token = "t1"
    kc = write_kubeconfig(tmp_path / "kc", api.url)
    doc = yaml.safe_load(kc.read_text())
    doc["users"][0]["user"] = {"tokenFile": "token"}  # relative to the kubeconfig
    kc.write_text(yaml.safe_dump(doc))
    api.add_pod(make_pod("a", NODE))
    w = PodWatcher(NODE, lambda: None, kubeconfig=str(kc), request_timeout_s=10, watch_timeout_s=30, backoff=FAST)
    w.start()
    try:
        assert wait(lambda: w.synced and names(w) == {"a"})
        rotate("t2")
        api.token = "t2"
        api.drop_watches()
        b = api.add_pod(make_pod("b", NODE))
        assert wait(lambda: at_least(w, rv(b)) and names(w) == {"a", "b"})
        assert api.watch_requests()[-1]["authorization"] == "Bearer t2"

        api.token = "t3"  # the server no longer takes t2; the file still has it
        api.drop_watches()
        assert wait(lambda: w.last_error is not None and "HTTP 401" in w.last_error)
        assert not w.synced
        rotate("t3")
        c = api.add_pod(make_pod("c", NODE))
        assert wait(lambda: w.synced and at_least(w, rv(c)))
        assert names(w) == {"a", "b", "c"}
        assert {r["authorization"] for r in api.requests} == {"Bearer t1", "Bearer t2", "Bearer t3"}
    finally:
        w.stop()
