"""daemonset/components/seccomp-localhost: the agent under the generated Localhost profile.

Rendered with the base (strictly validated with every other component in test_kustomize.py's "+all"
rendering, 1.29-1.31), the agent container asks for Localhost shaperd/agent.json, an init container
under RuntimeDefault puts the ConfigMap's profile at the kubelet's seccomp root first, the ConfigMap
holds the committed profile byte for byte, and the profile is a well-formed OCI seccomp profile that
allows bpf. The init container's script itself is run here on files: it writes a missing or changed
profile atomically and leaves an unchanged one alone.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_kustomize import DS, K8S_VERSIONS, KUSTOMIZE, ROOT, api_server_errors, by_kind, overlay, render

PROFILE = DS / "components" / "seccomp-localhost" / "agent.json"
SCRIPT = ROOT / "scripts" / "gen-seccomp-profile"


def gen():
    loader = importlib.machinery.SourceFileLoader("gen_seccomp_profile", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gen_seccomp_profile", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> list[dict]:
    if KUSTOMIZE is None:
        pytest.skip("no kustomize v4+ on PATH")
    return render(overlay(tmp_path_factory.mktemp("ov"), ["seccomp-localhost"]))


def agent(docs):
    (ds,) = by_kind(docs, "DaemonSet")
    return ds["spec"]["template"]["spec"]


def test_the_agent_runs_under_the_localhost_profile_after_the_init_container_put_it_there(docs):
    spec = agent(docs)
    (c,) = spec["containers"]
    assert c["securityContext"]["seccompProfile"] == {"type": "Localhost", "localhostProfile": "shaperd/agent.json"}
    # the rest of the agent's hardening is the base's, untouched by the patch
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "BPF"]}
    (init,) = spec["initContainers"]
    assert init["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["image"] == c["image"]  # the agent's image: no second image to pull or pin
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    host = vols[mounts["/host-seccomp"]]["hostPath"]
    # the kubelet resolves localhostProfile under <root-dir>/seccomp: the file the init container writes
    assert Path(host["path"]) / Path(init["command"][-1]).name == Path("/var/lib/kubelet/seccomp/shaperd/agent.json")
    assert init["command"][-2] == "/profile/agent.json" and mounts["/profile"] == "seccomp-profile"
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == vols["seccomp-profile"]["configMap"]["name"]]
    assert cm["data"]["agent.json"] == PROFILE.read_text()
    assert cm["metadata"]["name"].startswith("shaperd-seccomp-")  # hashed: a new profile rolls the DaemonSet
    assert api_server_errors(spec) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_rendering_is_valid_strict_for(version, docs):
    kv = pytest.importorskip("kubernetes_validate")
    for d in docs:
        kv.validate(d, version, strict=True)


def test_the_profile_is_an_oci_seccomp_profile_that_allows_bpf_and_refuses_the_rest():
    doc = json.loads(PROFILE.read_text())
    assert doc["defaultAction"] == "SCMP_ACT_ERRNO" and doc["defaultErrnoRet"] == 1
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"} <= set(doc["architectures"])
    (rule,) = doc["syscalls"]
    assert rule["action"] == "SCMP_ACT_ALLOW" and rule["names"] == sorted(set(rule["names"]))
    names = set(rule["names"])
    assert {"bpf", "socket", "sendto", "recvfrom", "execve", "futex", "exit_group"} <= names
    # what the agent never calls stays refused, among them what a container escape would need
    assert not names & {"mount", "umount2", "pivot_root", "init_module", "finit_module", "kexec_load", "ptrace",
                        "setns", "open_by_handle_at", "keyctl", "add_key", "reboot", "swapon"}


def test_the_profile_is_what_the_generator_renders_of_its_own_names():
    g = gen()
    assert g.render(g.committed()) == PROFILE.read_text()  # the committed file was written by the script
    # the fixed additions are said in the script: arm64's names for what x86_64 calls by an older name
    assert all(g.ARM64[n] in g.committed() for n in g.committed() if n in g.ARM64)


def test_parse_strace_reads_calls_and_resumed_calls_not_signals_or_exits():
    text = ("1234  socket(AF_NETLINK, SOCK_RAW|SOCK_CLOEXEC, NETLINK_ROUTE) = 3\n"
            "1235  futex(0x7f, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL <unfinished ...>\n"
            "1234  <... epoll_wait resumed>[], 1, 100) = 0\n"
            "1234  bpf(BPF_PROG_LOAD, {...}, 148) = -1 EPERM (Operation not permitted)\n"
            "1236  --- SIGTERM {si_signo=SIGTERM, si_code=SI_USER} ---\n"
            "1236  +++ exited with 0 +++\n"
            "rt_sigreturn({mask=[]}) = 0\n")
    assert gen().parse_strace(text) == {"socket", "futex", "epoll_wait", "bpf", "rt_sigreturn"}


def _init_script(docs) -> list[str]:
    (init,) = agent(docs)["initContainers"]
    return init["command"][:3]


@pytest.mark.skipif(sys.platform != "linux", reason="linux")
def test_the_init_containers_script_writes_a_changed_profile_atomically_and_leaves_an_equal_one(docs, tmp_path):
    py, flag, script = _init_script(docs)
    assert py == "/opt/shaperd/bin/python" and flag == "-c"
    src, dst = tmp_path / "agent.json", tmp_path / "host" / "agent.json"
    dst.parent.mkdir()
    src.write_text('{"defaultAction": "SCMP_ACT_ERRNO"}\n')

    def run() -> str:
        r = subprocess.run([sys.executable, "-c", script, str(src), str(dst)], capture_output=True, text=True,
                           timeout=30, start_new_session=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "written" in run() and dst.read_text() == src.read_text()
    before = os.stat(dst)
    assert "unchanged" in run() and os.stat(dst).st_ino == before.st_ino  # not written again
    src.write_text('{"defaultAction": "SCMP_ACT_LOG"}\n')
    assert "written" in run() and dst.read_text() == src.read_text()
    assert os.stat(dst).st_ino != before.st_ino and not (tmp_path / "host" / "agent.json.tmp").exists()
