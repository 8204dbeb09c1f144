"""Issue 14, API faults at the watcher (no root): 500s, 410 loops, truncated watch streams, a slow
server and a 5,000-pod list. The pod cache stays what it was while the API is broken, the loop backs
off (the delays it asks for climb to the cap: no hot loop), and it recovers.

Timing-free like test_k8s_watch.py: the backoff is asserted as the delays the watcher asked for (an
injected ``wait`` records them and sleeps only a token 10 ms so the loop does not spin), waits are on
conditions with a deadline that bounds a failure only.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from shaperd.discovery.kubernetes import Backoff, PodWatcher
from tests.k8s_fake import FakeKubeAPI, make_pod, write_kubeconfig

NODE = "gpu-node-7"
DEADLINE = 30.0
BACKOFF = Backoff(initial_s=0.05, max_s=0.4, jitter=0.5)
CEILINGS = [0.05, 0.1, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4]  # Backoff(0.05, max 0.4): the ceiling per failure


def wait(pred, timeout: float = DEADLINE) -> bool:
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


class Recorder:
    """The watcher's wait(): records each delay; ``armed`` only once the fault is on."""

    def __init__(self):
        self.delays: list[float] = []
        self.armed = False
        self.enough = threading.Event()

    def __call__(self, d: float) -> None:
        if self.armed:
            self.delays.append(d)
            if len(self.delays) >= len(CEILINGS):
                self.enough.set()
        time.sleep(0.01)


@pytest.fixture
def watcher(api, tmp_path):
    made = []

    def make(**kw):
        rec = Recorder()
        w = PodWatcher(NODE, lambda: None, kubeconfig=str(write_kubeconfig(tmp_path / "kc", api.url)),
                       request_timeout_s=kw.pop("request_timeout_s", 10.0), watch_timeout_s=30,
                       backoff=BACKOFF, rng=random.Random(7), wait=rec, **kw)
        made.append(w)
        w.start()
        return w, rec

    yield make
    for w in made:
        w.stop()


def known(api, n=3):
    return [api.add_pod(make_pod(f"p{i}", NODE, ips=(f"198.19.0.{i + 1}",))) for i in range(n)]


def assert_backs_off_to_the_cap(rec: Recorder) -> None:
    """The delays climb 2x per failure (jittered into [d/2, d]) and reach the cap: a hot loop would stay at
    the first step. A 410 costs one extra first step (the first relist is immediate and a good list ends
    an outage), hence "within one step" of the schedule."""
    assert rec.enough.wait(DEADLINE), rec.delays
    d = rec.delays[: len(CEILINGS)]
    assert all(x <= BACKOFF.max_s for x in d), d
    assert all(x >= c / 2 for x, c in zip(d[1:], CEILINGS)), d
    assert all(x >= BACKOFF.max_s / 2 for x in d[-3:]), d


@pytest.mark.parametrize("fault", ["500", "410-loop", "truncated"])
def test_fault_keeps_the_cache_backs_off_and_recovers(api, watcher, fault):
    pods = known(api)
    w, rec = watcher()
    assert wait(lambda: w.synced and len(w.snapshot()) == 3)
    before = w.snapshot()
    rec.armed = True  # before the fault: its first failure is attempt 0
    if fault == "500":
        api.fail_status = 500
        api.drop_watches()  # the open watch is cut; every new request gets a 500
    elif fault == "410-loop":
        api.gone_loop = True
        api.drop_watches()
    else:
        api.truncate_watches = True
        api.drop_watches()
    assert_backs_off_to_the_cap(rec)
    assert w.snapshot() == before  # the cache is kept: enforcement of known pods continues
    assert w.has_synced
    if fault == "500":
        assert not w.synced and "500" in (w.last_error or "")
    # Recovery: the fault ends, a change made meanwhile arrives.
    api.fail_status, api.gone_loop, api.truncate_watches = None, False, False
    api.delete_pod(pods[0]["metadata"]["uid"])
    new = api.add_pod(make_pod("after", NODE, ips=("198.19.0.99",)))
    assert wait(lambda: w.synced and new["metadata"]["uid"] in w.snapshot()
                and pods[0]["metadata"]["uid"] not in w.snapshot())


def test_410_loop_relists_at_a_backed_off_pace_not_in_a_hot_loop(api, watcher):
    known(api)
    w, rec = watcher()
    assert wait(lambda: w.synced)
    lists_before = len(api.list_requests())
    rec.armed = True
    api.gone_loop = True
    api.drop_watches()
    assert_backs_off_to_the_cap(rec)
    relists = len(api.list_requests()) - lists_before
    # one relist per 410 at most, and the delays between them climbed: not one list per 0.5 s forever
    assert 1 <= relists <= len(rec.delays) + 2, (relists, rec.delays)


@pytest.mark.slow  # 8-35 s (--durations, quiet)
def test_slow_server_answers_late_but_the_cache_is_served_meanwhile(api, watcher):
    pods = known(api)
    w, rec = watcher(request_timeout_s=30.0)
    assert wait(lambda: w.synced and len(w.snapshot()) == 3)
    api.delay_s = 10.0  # every answer 10 s late (the "slow API server")
    api.drop_watches()
    t = time.monotonic()
    assert len(w.snapshot()) == 3  # served from the cache at once while the server is slow
    new = api.add_pod(make_pod("slow", NODE, ips=("198.19.0.77",)))
    assert wait(lambda: new["metadata"]["uid"] in w.snapshot(), timeout=DEADLINE)
    took = time.monotonic() - t
    assert took >= 10.0  # it came through the slow server (not a fast path we did not mean to test)
    assert {p["metadata"]["uid"] for p in pods} <= set(w.snapshot())


def test_list_of_5000_pods(api, watcher):
    for i in range(5000):
        api.pods[f"uid-{i}"] = make_pod(f"big-{i}", NODE, ips=(f"198.19.{64 + i // 250}.{i % 250 + 1}",),
                                        uid=f"uid-{i}", labels={"training-tenant": "tenant-a"})
    w, _ = watcher()
    t = time.monotonic()
    assert wait(lambda: w.synced and len(w.snapshot()) == 5000, timeout=60)
    print(f"\n5,000-pod list cached in {time.monotonic() - t:.2f} s")
    api.delete_pod("uid-0")
    assert wait(lambda: "uid-0" not in w.snapshot() and len(w.snapshot()) == 4999)
