"""bpf() refused by a real seccomp filter (tests/seccomp_deny.py, as a container runtime's RuntimeDefault
profile can): the probe types it, ``shaperd status -o json`` and a short daemon run in a fresh namespace say
it as degraded, ``shaperd_bpf_syscall_refused{cause="seccomp"} 1`` is served, and exactly one warning line
names the runtime's profile. Without the filter, the same probe finds bpf() working and says nothing of it.
Every wait is on a condition with a deadline; the bed's namespaces and processes go at the end, however it ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests import procs

from .conftest import PY, needs_root, wait_for

pytestmark = needs_root

DENY = str(Path(__file__).resolve().parents[1] / "seccomp_deny.py")
PORT = 9567  # inside the bed's node namespace
DEADLINE_S = 60.0  # bounds a failure only
CONFIG = """node:
  interfaces: [up0]
  capacity: 1Gbps
tenants:
  - name: tenant-a
    bandwidthGuarantee: 100Mbps
    priority: 10
    match: {cidrs: [198.18.1.0/24]}
"""
PROBE = ("import json; from shaperd.engine.probe import probe_capabilities as p; c = p(); "
         "print(json.dumps({'bpf': c.bpf, 'refused': c.bpf_refused, 'notes': list(c.notes)}))")
SCRAPE = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), timeout=20)
    print(r.status); sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); sys.stdout.write(e.read().decode())
except OSError as e:
    print(0); sys.stdout.write(str(e))
"""
ENV = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "NOTIFY_SOCKET", "WATCHDOG_USEC")}


def probe_json(bed, *prefix: str) -> dict:
    out = bed.exec(*prefix, PY, "-c", PROBE).stdout
    return json.loads(out.strip().splitlines()[-1])


def scrape(bed, path: str) -> tuple[int, str]:
    out = bed.exec(PY, "-c", SCRAPE, str(PORT), path, check=False).stdout
    code, _, body = out.partition("\n")
    return (int(code) if code.isdigit() else 0), body


def refused_series(bed) -> list | None:
    code, body = scrape(bed, "/metrics")
    if code != 200 or "shaperd_reconciles_total" not in body:
        return None
    return [(s.labels, s.value) for f in text_string_to_metric_families(body)
            if f.name == "shaperd_bpf_syscall_refused" for s in f.samples]


def test_the_probe_under_the_filter_types_the_refusal_and_without_it_finds_bpf(bed):
    assert probe_json(bed, PY, DENY)["refused"] == "bpf_refused_by_seccomp"
    plain = probe_json(bed)
    assert plain["bpf"] and plain["refused"] == "", plain  # this machine's kernel loads programs as root


def test_status_and_a_daemon_under_the_filter_say_degraded_the_metric_and_one_warning(bed, tmp_path):
    cfg = tmp_path / "tenants.yaml"
    cfg.write_text(CONFIG)
    # shaperd status -o json: degraded, the refusal first, exit 1 (something planned is not enforced)
    st = bed.exec(PY, DENY, PY, "-m", "shaperd", "status", "--config", str(cfg), "--interval", "0.05", "-o", "json",
                  check=False)
    assert st.returncode == 1, st.stdout + st.stderr
    doc = json.loads(st.stdout.splitlines()[-1])["degraded"]
    assert doc["summary"].startswith("degraded: 1 system call refused (bpf() refused by seccomp"), doc
    assert [r["reason"] for r in doc["refused"]] == ["bpf_refused_by_seccomp"]

    log = tmp_path / "daemon.log"
    with open(log, "w") as logf:
        p = bed.spawn([PY, DENY, PY, "-m", "shaperd", "--log-json", "run", "--config", str(cfg), "--metrics-address",
                       f"127.0.0.1:{PORT}", "--resync-interval", "600"], bed.node, env=ENV, stdout=logf,
                      stderr=subprocess.STDOUT)
    try:
        got = wait_for(lambda: refused_series(bed), DEADLINE_S, 0.2)
        assert got == [({"cause": "seccomp"}, 1.0)], log.read_text()[-3000:]
        code, body = scrape(bed, "/readyz")
        assert code == 200 and body.startswith("ready: degraded: 1 system call refused (bpf() refused by seccomp"), body
        code, body = scrape(bed, "/healthz")
        assert code == 200 and "bpf() refused by seccomp" in body, body
        # the kernel: enforced all the same, by the u32 path
        up0 = json.loads(bed.exec("tc", "-j", "qdisc", "show", "dev", "up0").stdout)
        assert any(q["kind"] == "htb" and q.get("root") for q in up0), up0
        os.kill(p.pid, signal.SIGTERM)  # by id: `ip netns exec` execs, so this is the agent
        assert p.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        procs.stop(p)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    loud = [x for x in lines if x.get("level") in ("warning", "error") or x.get("log_level") in ("warning", "error")]
    said = [x for x in loud if "bpf" in json.dumps(x)]
    assert len(said) == 1, said
    (w,) = said
    assert w["event"] == "bpf() refused by seccomp" and w["reason"] == "bpf_refused_by_seccomp"
    assert "RuntimeDefault" in w["cause"] and "seccomp-localhost" in w["fix"], w
