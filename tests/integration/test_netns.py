"""shaperd_bed.netns, the namespace helper of the bed, the tests and the benchmarks: what it makes
is removed, processes go with their whole group, deadlines hold."""

from __future__ import annotations

import os
import subprocess

import pytest
from shaperd_bed import netns

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

# Forks a child that outlives nothing: prints "parent child" pids, then both sleep.
FORKER = r"""
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(120)
    os._exit(0)
print(os.getpid(), pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pids(p: subprocess.Popen) -> list[int]:
    line = p.stdout.readline().split()
    assert len(line) == 2, line
    return [int(x) for x in line]


@pytest.fixture
def tag(request):
    return f"shnt{os.getpid() % 100000}{abs(hash(request.node.name)) % 1000}"


def test_cleanup_removes_namespaces_and_every_process_even_after_a_failure(tag):
    nets = netns.Namespaces(stop_grace_s=0.5)
    with pytest.raises(ZeroDivisionError):
        with nets:
            a, b = nets.add(f"{tag}-a"), nets.add(f"{tag}-b", ipv6=False)
            netns.veth("va", a, "vb", b)
            netns.addr(a, "va", "198.18.40.1/24", "2001:db8:40::1/64")
            netns.addr(b, "vb", "198.18.40.2/24")
            netns.neigh(a, "va", "198.18.40.2", netns.link(b, "vb")["address"])
            assert "PERMANENT" in netns.run(["ip", "neigh", "show", "dev", "va"], a).stdout
            assert "tentative" not in netns.run(["ip", "-6", "addr"], a).stdout
            assert netns.run(["sysctl", "-n", "net.ipv6.conf.all.disable_ipv6"], b).stdout.strip() == "1"
            tracked = _pids(nets.spawn([PY, "-c", FORKER], a))
            # started behind the helper's back, inside the namespace: found by `ip netns pids`
            stray = subprocess.Popen(["ip", "netns", "exec", b, PY, "-c", FORKER], stdout=subprocess.PIPE, text=True)
            strays = _pids(stray)
            1 / 0
    stray.wait(timeout=10)
    assert not {f"{tag}-a", f"{tag}-b"} & set(netns.list_netns())
    assert wait_for(lambda: not any(_alive(p) for p in tracked + strays), 5), (tracked, strays)


def test_a_deadline_ends_the_whole_process_group(tag):
    with netns.Namespaces() as nets:
        ns = nets.add(tag)
        p = nets.spawn([PY, "-c", FORKER], ns, deadline_s=1.0)
        pids = _pids(p)
        assert p.wait(timeout=20) == -9
        assert getattr(p, "deadline_expired", False)
        assert wait_for(lambda: not any(_alive(x) for x in pids), 5), pids


def test_run_timeout_kills_the_group_and_raises(tmp_path):
    out = tmp_path / "pids"
    code = ("import os, sys, time; os.fork(); open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); "
            "time.sleep(120)")
    with pytest.raises(subprocess.TimeoutExpired):
        netns.run([PY, "-c", code, str(out)], timeout=2.0)
    pids = [int(x) for x in out.read_text().split()]
    assert len(pids) == 2, pids  # parent and forked child both started...
    assert wait_for(lambda: not any(_alive(p) for p in pids), 5), pids  # ...and both are gone


def test_a_namespace_it_did_not_create_is_never_adopted(tag):
    other = netns.add_netns(f"{tag}-other")
    try:
        nets = netns.Namespaces()
        with pytest.raises(netns.CommandError):
            nets.add(other)
        nets.cleanup()
        assert other in netns.list_netns()
    finally:
        netns.delete_netns(other)
    assert other not in netns.list_netns()
