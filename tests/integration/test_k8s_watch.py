"""PodWatcher against a fake API server, through the official client library (no root).

Every test gets its own fake server, kubeconfig and watcher, stopped even
when the test fails. Timings are short (backoff 0.05..0.5 s) so the suite
is quick; the assertions are about behaviour, not exact delays.
"""

from __future__ import annotations

import threading
import time

import pytest

from shaperd.discovery.kubernetes import Backoff, KubernetesConfigError, PodWatcher, load_client_config
from tests.k8s_fake import FakeKubeAPI, make_pod, write_kubeconfig

NODE = "gpu-node-7"


class Changes:
    """Counts on_change calls; the test waits for the next one."""

    def __init__(self):
        self.n = 0
        self.cond = threading.Condition()

    def __call__(self):
        with self.cond:
            self.n += 1
            self.cond.notify_all()

    def wait_beyond(self, n: int, timeout: float = 1.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.n > n, timeout)


def wait(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return bool(pred())


@pytest.fixture
def api():
    fake = FakeKubeAPI()
    yield fake
    fake.close()


@pytest.fixture
def make_watcher(api, tmp_path):
    made = []
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)

    def make(node=NODE, watch_timeout_s=30, **kw):
        changes = Changes()
        w = PodWatcher(node, changes, kubeconfig=str(kubeconfig), request_timeout_s=kw.pop("request_timeout_s", 2.0),
                       watch_timeout_s=watch_timeout_s, backoff=Backoff(initial_s=0.05, max_s=0.5), **kw)
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
    w, changes = make_watcher()
    assert wait(lambda: w.synced)
    assert names(w) == {"a"}
    assert changes.n == 1  # the initial list

    n = changes.n
    b = api.add_pod(make_pod("b", NODE, ips=("10.0.0.2", "fd00::2"), qos="Guaranteed"))
    assert changes.wait_beyond(n)
    pb = w.snapshot()[b["metadata"]["uid"]]
    assert pb.ips == ("10.0.0.2", "fd00::2") and pb.qos_class == "Guaranteed" and pb.node == NODE

    n = changes.n
    api.set_labels(a["metadata"]["uid"], {"tenant": "red"})
    assert changes.wait_beyond(n)
    assert w.snapshot()[a["metadata"]["uid"]].labels == {"tenant": "red"}

    n = changes.n
    api.delete_pod(b["metadata"]["uid"])
    assert changes.wait_beyond(n)
    assert names(w) == {"a"}

    # a pod on another node changes: nothing reaches us
    n = changes.n
    api.add_pod(make_pod("c", "other-node"))
    assert not changes.wait_beyond(n, 0.3)


def test_modified_that_shaperd_ignores_does_not_call_on_change(api, make_watcher):
    a = api.add_pod(make_pod("a", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced)
    n = changes.n
    api.modify_pod(a["metadata"]["uid"], lambda p: p["status"].__setitem__("conditions", [{"type": "Ready"}]))
    assert wait(lambda: w.resource_version == a["metadata"]["resourceVersion"] or
                int(w.resource_version) > int(a["metadata"]["resourceVersion"]))
    assert not changes.wait_beyond(n, 0.3)
    api.modify_pod(a["metadata"]["uid"], lambda p: p["status"].__setitem__("phase", "Succeeded"))
    assert changes.wait_beyond(n)
    assert w.snapshot()[a["metadata"]["uid"]].phase == "Succeeded"


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
    w, _ = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    api.unrelated_writes(7)  # other nodes' pods: the global version moves, we see no event
    bm = api.bookmark()
    assert wait(lambda: w.resource_version == str(bm))
    before = len(api.watch_requests())
    api.drop_watches()
    assert wait(lambda: len(api.watch_requests()) > before)
    assert api.watch_requests()[-1]["resourceVersion"] == str(bm)
    assert len(api.list_requests()) == 1  # resumed, not relisted


def test_watch_timeout_resumes_from_last_version(api, make_watcher):
    w, changes = make_watcher(watch_timeout_s=1)
    assert wait(lambda: w.synced)
    a = api.add_pod(make_pod("a", NODE))
    assert wait(lambda: len(api.watch_requests()) >= 2, 4)
    assert api.watch_requests()[1]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert len(api.list_requests()) == 1 and w.synced


@pytest.mark.parametrize("gone_as_http", [False, True], ids=["error-event", "http-410"])
def test_410_relists_and_forgets_pods_deleted_in_the_gap(api, make_watcher, gone_as_http):
    api.gone_as_http = gone_as_http
    a = api.add_pod(make_pod("a", NODE))
    b = api.add_pod(make_pod("b", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    api.hang()  # the watch goes silent ...
    time.sleep(0.1)
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
    api.add_pod(make_pod("a", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced)
    api.go_down()
    assert wait(lambda: not w.synced, 2)
    assert names(w) == {"a"} and w.has_synced  # last known state is still served
    assert "Connection refused" in (w.last_error or "") or "watch pods" in (w.last_error or "")
    t_down = time.monotonic()
    time.sleep(1.0)
    # backoff: attempts spread out (0.05 doubling to 0.5 s cap) instead of a tight loop
    assert not w.synced
    api.come_back()
    n = changes.n
    b = api.add_pod(make_pod("b", NODE))
    assert wait(lambda: w.synced, 3)
    assert w.last_error is None
    assert changes.wait_beyond(n, 2)
    assert b["metadata"]["uid"] in w.snapshot()
    # resumed the watch from the version it had, no relist needed
    assert len(api.list_requests()) == 1
    assert time.monotonic() - t_down < 5


def test_reconnects_back_off_exponentially(api, tmp_path):
    """While the server is down, attempts are spaced further and further apart (with jitter)."""
    api.go_down()
    kubeconfig = write_kubeconfig(tmp_path / "kc", api.url)
    times: list[float] = []
    w = PodWatcher(NODE, lambda: None, kubeconfig=str(kubeconfig), request_timeout_s=1,
                   backoff=Backoff(initial_s=0.05, max_s=0.4, jitter=0.0))
    orig = w._list

    def counted(consistent):
        times.append(time.monotonic())
        return orig(consistent)

    w._list = counted
    w.start()
    try:
        time.sleep(1.6)
    finally:
        w.stop()
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(gaps) >= 4
    assert gaps[0] < 0.15 and gaps[1] > gaps[0] and max(gaps) < 0.6
    assert not w.synced and not w.has_synced and w.snapshot() == {}


def test_garbage_line_resumes_from_last_good_version(api, make_watcher):
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    a = api.add_pod(make_pod("a", NODE))
    assert wait(lambda: names(w) == {"a"})
    before = len(api.watch_requests())
    api.garbage("<html>502 Bad Gateway</html>")
    b = api.add_pod(make_pod("b", NODE))
    assert wait(lambda: names(w) == {"a", "b"}, 3)
    # the stream was abandoned at the garbage and resumed from a's version, so b was not lost
    assert api.watch_requests()[before]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert wait(lambda: w.synced)


def test_poison_line_in_history_leads_to_a_relist(api, make_watcher):
    w, changes = make_watcher()
    assert wait(lambda: w.synced and api.watch_requests())
    a = api.add_pod(make_pod("a", NODE))
    api.garbage("{{{ truncated", persistent=True)  # replayed to every watch resuming before it
    b = api.add_pod(make_pod("b", NODE))
    assert wait(lambda: names(w) == {"a", "b"}, 3)
    assert wait(lambda: w.synced)
    lists = api.list_requests()
    assert len(lists) == 2 and lists[1]["resourceVersion"] is None
    assert a["metadata"]["uid"] in w.snapshot() and b["metadata"]["uid"] in w.snapshot()


def test_malformed_pods_are_skipped_others_applied(api, make_watcher):
    bad_list = make_pod("bad-in-list", NODE)
    bad_list["metadata"]["labels"] = ["not", "a", "map"]
    api.add_pod(bad_list)
    api.add_pod(make_pod("good-in-list", NODE))
    w, changes = make_watcher()
    assert wait(lambda: w.synced)
    assert names(w) == {"good-in-list"}

    bad_ip = make_pod("bad-ip", NODE, ips=("not-an-ip",))
    api.raw_event("ADDED", bad_ip)
    no_uid = make_pod("no-uid", NODE)
    del no_uid["metadata"]["uid"]
    api.raw_event("ADDED", no_uid)
    api.raw_event("ADDED", "a string, not a pod")  # valid JSON, not an object
    host = api.add_pod(make_pod("good-after", NODE, host_network=True, ips=("192.0.2.10",)))
    assert wait(lambda: names(w) == {"good-in-list", "good-after"}, 3)
    assert w.snapshot()[host["metadata"]["uid"]].host_network is True
    # a pod that turns malformed keeps its last good entry; a later good event applies
    uid = host["metadata"]["uid"]
    api.modify_pod(uid, lambda p: p["spec"].__setitem__("hostNetwork", "yes"))
    time.sleep(0.2)
    assert w.snapshot()[uid].host_network is True and w.synced

    def repair(p):
        p["spec"]["hostNetwork"] = True
        p["metadata"]["labels"] = {"tenant": "x"}
    api.modify_pod(uid, repair)
    assert wait(lambda: w.snapshot()[uid].labels == {"tenant": "x"})
    assert w.snapshot()[uid].host_network is True


def test_hanging_server_does_not_block_stop(api, make_watcher):
    w, _ = make_watcher(request_timeout_s=30.0)
    assert wait(lambda: w.synced and api.watch_requests())
    api.hang()
    api.drop_watches()  # the reconnect now waits on a server that never answers
    assert wait(lambda: len(api.watch_requests()) >= 2, 3)
    t = time.monotonic()
    w.stop()
    assert time.monotonic() - t < 2.5
    assert not w.synced


def test_stop_during_open_watch_is_prompt(api, make_watcher):
    w, _ = make_watcher(watch_timeout_s=300, request_timeout_s=30.0)
    assert wait(lambda: w.synced and api.watch_requests())
    time.sleep(0.2)
    t = time.monotonic()
    w.stop()
    assert time.monotonic() - t < 0.5
    assert not w._thread.is_alive()


def test_hanging_list_is_given_up_after_request_timeout(api, make_watcher):
    api.hang()
    w, _ = make_watcher(request_timeout_s=0.5)
    assert wait(lambda: w.last_error is not None, 3)
    assert "list pods on node" in w.last_error and "timed out" in w.last_error.lower()
    api.hang(False)
    assert wait(lambda: w.synced, 3)


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
    response (a window the library's own Watch.stop misses) still ends the thread: without
    the cut it would read until the server's timeout (300 s here)."""
    from kubernetes import client

    kubeconfig = write_kubeconfig(tmp_path / "kc", api.url)
    w = PodWatcher(NODE, lambda: None, kubeconfig=str(kubeconfig), request_timeout_s=10, watch_timeout_s=300)
    orig = client.CoreV1Api.list_pod_for_all_namespaces
    stopper: list[threading.Thread] = []

    def list_then_stop(self, **kw):
        resp = orig(self, **kw)
        if kw.get("watch") and not stopper:
            t = threading.Thread(target=w.stop, kwargs={"timeout_s": 30}, daemon=True)
            stopper.append(t)
            t.start()
            assert w._stop.wait(30)  # stop() has begun; the library has not seen resp yet
        return resp

    monkeypatch.setattr(client.CoreV1Api, "list_pod_for_all_namespaces", list_then_stop)
    w.start()
    try:
        assert wait(lambda: stopper, 30)
        stopper[0].join(20)
        assert not stopper[0].is_alive() and not w._thread.is_alive()
    finally:
        w.stop()
