"""Credentials without the kubernetes package: kubeconfig parsing and merging, exec credential plugins,
the in-cluster service account's rotating token (discovery/kubernetes/kubeconfig.py, auth.py).

No network and no timing: the exec plugin is a small Python script written per test, expiry and the
token refresh period are judged on injected clocks, and a plugin that hangs is bounded by its deadline.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from shaperd.discovery.kubernetes import KubernetesConfigError, KubernetesError, load_client_config
from shaperd.discovery.kubernetes.auth import ExecPlugin, StaticToken, TokenFile
from shaperd.discovery.kubernetes.kubeconfig import load_in_cluster, load_kubeconfig

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
CA = b"-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n"
CERT = b"-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def kubeconfig(path: Path, *, server="https://198.18.0.1:6443", cluster=None, user=None, context="c",
               current="c", cluster_name="k", user_name="u", extra_contexts=()) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": user_name, "user": user or {}}],
        "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": user_name}}, *extra_contexts],
    }
    if current:
        doc["current-context"] = current
    path.write_text(yaml.safe_dump(doc))
    return path


def test_certificates_as_data(tmp_path):
    kc = kubeconfig(tmp_path / "kc", cluster={"certificate-authority-data": b64(CA), "tls-server-name": "api.k"},
                    user={"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)})
    cfg = load_kubeconfig([str(kc)])
    assert (cfg.host, cfg.ca_pem, cfg.client_cert_pem, cfg.client_key_pem) == ("https://198.18.0.1:6443", CA, CERT, KEY)
    assert cfg.tls_server_name == "api.k" and not cfg.insecure_skip_tls_verify and cfg.auth is None
    assert cfg.source == f"kubeconfig {kc} (context c)"


def test_certificates_and_token_file_as_files_relative_to_the_kubeconfig(tmp_path, monkeypatch):
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(CA)
    (tmp_path / "pki" / "me.crt").write_bytes(CERT)
    (tmp_path / "pki" / "me.key").write_bytes(KEY)
    (tmp_path / "pki" / "token").write_text("tok-from-file\n")
    kc = kubeconfig(tmp_path / "kc", cluster={"certificate-authority": "pki/ca.crt"},
                    user={"client-certificate": "pki/me.crt", "client-key": str(tmp_path / "pki" / "me.key"),
                          "tokenFile": "pki/token"})
    monkeypatch.chdir("/")  # relative to the kubeconfig's directory, not to where we run
    cfg = load_kubeconfig([str(kc)])
    assert (cfg.ca_pem, cfg.client_cert_pem, cfg.client_key_pem) == (CA, CERT, KEY)
    assert isinstance(cfg.auth, TokenFile) and cfg.auth.credential().token == "tok-from-file"


def test_static_token_and_insecure_skip_tls_verify(tmp_path):
    cfg = load_kubeconfig([str(kubeconfig(tmp_path / "kc", cluster={"insecure-skip-tls-verify": True},
                                          user={"token": "abc"}))])
    assert isinstance(cfg.auth, StaticToken) and cfg.auth.credential().token == "abc"
    assert cfg.insecure_skip_tls_verify and cfg.ca_pem is None


def test_several_files_first_definition_and_first_current_context_win(tmp_path, monkeypatch):
    a = kubeconfig(tmp_path / "a", server="https://198.18.0.1", user={"token": "from-a"}, current="")
    b = kubeconfig(tmp_path / "b", server="https://198.18.0.2", user={"token": "from-b"}, current="c",
                   cluster_name="k2", user_name="u")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(a), str(b)]))
    cfg = load_client_config(None)
    # context "c" and user "u": a's (first); current-context: b's (a sets none); cluster k from a's context
    assert cfg.host == "https://198.18.0.1" and cfg.auth.credential().token == "from-a"
    assert cfg.source.startswith(f"kubeconfig {a} ")


def test_explicit_context(tmp_path):
    kc = kubeconfig(tmp_path / "kc", extra_contexts=[{"name": "other", "context": {"cluster": "nope"}}])
    assert load_kubeconfig([str(kc)], context="c").host == "https://198.18.0.1:6443"
    with pytest.raises(KubernetesConfigError, match=r"contexts\[name=other\].context.cluster: no cluster named 'nope'"):
        load_kubeconfig([str(kc)], context="other")


@pytest.mark.parametrize("cluster, user, current, field", [
    ({}, {"client-key-data": "%%%not base64", "client-certificate-data": b64(CERT)}, "c",
     r"users\[name=u\].user.client-key-data: not base64"),
    ({}, {"client-certificate-data": b64(CERT)}, "c", r"users\[name=u\].user.client-key\(-data\): missing"),
    ({"certificate-authority": "/nonexistent/ca.crt"}, {}, "c",
     r"clusters\[name=k\].cluster.certificate-authority: /nonexistent/ca.crt: No such file"),
    ({"insecure-skip-tls-verify": "yes"}, {}, "c", r"insecure-skip-tls-verify: expected true or false"),
    ({"proxy-url": "http://198.18.0.9:3128"}, {}, "c", r"proxy-url: not supported"),
    ({}, {"auth-provider": {"name": "oidc"}}, "c", r"users\[name=u\].user.auth-provider: not supported"),
    ({}, {"as": "admin"}, "c", r"users\[name=u\].user.as: not supported"),
    ({}, {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}}, "c",
     r"user.exec.apiVersion: 'client.authentication.k8s.io/v1alpha1' is not one of"),
    ({}, {"exec": {"apiVersion": V1}}, "c", r"user.exec.command: missing"),
    ({}, {"exec": {"command": "x", "apiVersion": V1, "interactiveMode": "Always"}}, "c",
     r"interactiveMode: Always needs a terminal"),
    ({}, {}, "", r"current-context: not set"),
    ({}, {}, "elsewhere", r"current-context: no context named 'elsewhere'"),
])
def test_bad_kubeconfig_names_the_file_and_the_field(tmp_path, cluster, user, current, field):
    kc = kubeconfig(tmp_path / "kc", cluster=cluster, user=user, current=current)
    with pytest.raises(KubernetesConfigError) as e:
        load_kubeconfig([str(kc)])
    assert str(e.value).startswith(f"load kubeconfig {kc}")
    import re

    assert re.search(field, str(e.value)), str(e.value)


def test_bad_server_and_bad_yaml(tmp_path):
    with pytest.raises(KubernetesConfigError, match=r"clusters\[name=k\].cluster.server: expected an http\(s\) URL"):
        load_kubeconfig([str(kubeconfig(tmp_path / "kc", server="198.18.0.1:6443"))])
    (tmp_path / "broken").write_text("clusters: [")
    with pytest.raises(KubernetesConfigError, match=f"load kubeconfig {tmp_path / 'broken'}: not YAML"):
        load_kubeconfig([str(tmp_path / "broken")])
    (tmp_path / "list").write_text("- 1\n")
    with pytest.raises(KubernetesConfigError, match="expected a mapping, got list"):
        load_kubeconfig([str(tmp_path / "list")])


# ---- exec credential plugins

PLUGIN = r'''#!{python}
import json, os, sys
state = sys.argv[1]
n = int(open(state).read()) + 1 if os.path.exists(state) else 1
open(state, "w").write(str(n))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open(state + ".info", "w") as f:
    json.dump({{"info": info, "env": os.environ.get("PLUGIN_ENV"), "args": sys.argv[2:]}}, f)
status = {{"token": "tok-%d" % n, "expirationTimestamp": "2030-01-01T00:%02d:00Z" % n}}
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "cert":
    status = {{"clientCertificateData": "CERT", "clientKeyData": "KEY"}}
if mode == "fail":
    sys.stderr.write("no credentials for you\n"); sys.exit(3)
if mode == "garbage":
    print("not json"); sys.exit(0)
if mode == "hang":
    import subprocess, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(state + ".child", "w").write(str(child.pid))
    time.sleep(600)
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
'''


def plugin(tmp_path: Path) -> Path:
    p = tmp_path / "bin" / "plugin"
    p.parent.mkdir(exist_ok=True)
    p.write_text(PLUGIN.format(python=sys.executable))
    p.chmod(0o755)
    return p


def epoch(ts: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(ts).timestamp()


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_exec_plugin_is_cached_until_expiry_then_run_again(tmp_path, api_version):
    plugin(tmp_path)
    state = tmp_path / "state"
    clock = [epoch("2030-01-01T00:00:30Z")]
    kc = kubeconfig(tmp_path / "kc", cluster={"certificate-authority-data": b64(CA)}, user={"exec": {
        "command": "bin/plugin", "apiVersion": api_version, "args": [str(state)], "provideClusterInfo": True,
        "env": [{"name": "PLUGIN_ENV", "value": "set"}], "interactiveMode": "Never"}})
    cfg = load_kubeconfig([str(kc)], now=lambda: clock[0])
    assert isinstance(cfg.auth, ExecPlugin) and not state.exists()  # not run at load time
    assert cfg.auth.credential().token == "tok-1"  # expires 00:01:00
    clock[0] = epoch("2030-01-01T00:00:59Z")
    assert cfg.auth.credential().token == "tok-1" and cfg.auth.runs == 1  # cached
    clock[0] = epoch("2030-01-01T00:01:00Z")
    assert cfg.auth.credential().token == "tok-2" and cfg.auth.runs == 2  # expired: run again
    cfg.auth.invalidate()  # what a 401 does
    assert cfg.auth.credential().token == "tok-3"
    seen = json.loads((tmp_path / "state.info").read_text())
    assert seen["env"] == "set" and seen["args"] == []
    assert seen["info"]["apiVersion"] == api_version and seen["info"]["spec"]["interactive"] is False
    assert seen["info"]["spec"]["cluster"] == {"server": "https://198.18.0.1:6443",
                                               "certificate-authority-data": b64(CA)}


def test_exec_plugin_client_certificate_and_failures(tmp_path):
    plugin(tmp_path)
    state = str(tmp_path / "state")

    def auth(mode: str, **kw) -> ExecPlugin:
        kc = kubeconfig(tmp_path / f"kc-{mode}", user={"exec": {"command": str(tmp_path / "bin" / "plugin"),
                                                               "apiVersion": V1, "args": [state, mode], **kw}})
        return load_kubeconfig([str(kc)], exec_timeout_s=1.0).auth

    c = auth("cert").credential()
    assert (c.token, c.cert_pem, c.key_pem) == (None, b"CERT", b"KEY")
    with pytest.raises(KubernetesError, match="exit status 3: no credentials for you") as e:
        auth("fail").credential()
    assert not isinstance(e.value, KubernetesConfigError)  # retried by the watch loop, not fatal
    with pytest.raises(KubernetesError, match="ExecCredential from exec credential plugin .*: not JSON"):
        auth("garbage").credential()
    with pytest.raises(KubernetesError, match="No such file.*; install it from x"):
        load_kubeconfig([str(kubeconfig(tmp_path / "kc-missing", user={"exec": {
            "command": "shaperd-no-such-plugin", "apiVersion": V1, "installHint": "install it from x"}}))]
        ).auth.credential()


def test_a_hanging_exec_plugin_is_killed_with_its_process_group(tmp_path):
    plugin(tmp_path)
    state = str(tmp_path / "state")
    kc = kubeconfig(tmp_path / "kc", user={"exec": {"command": str(tmp_path / "bin" / "plugin"), "apiVersion": V1,
                                                    "args": [state, "hang"]}})
    a = load_kubeconfig([str(kc)], exec_timeout_s=2.0).auth
    with pytest.raises(KubernetesError, match=r"no answer within 2 s; killed"):
        a.credential()
    child = int(Path(state + ".child").read_text())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # SIGKILL is asynchronous; the orphan is reaped by init
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the plugin's child {child} outlived the deadline")


# ---- in-cluster

def sa_dir(tmp_path: Path, token: str = "t1") -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    (d / "ca.crt").write_bytes(CA)
    (d / "token").write_text(token)
    return d


def test_in_cluster_address_ca_and_token(tmp_path):
    d = sa_dir(tmp_path)
    cfg = load_in_cluster({"KUBERNETES_SERVICE_HOST": "198.18.0.1", "KUBERNETES_SERVICE_PORT": "443"}, str(d))
    assert (cfg.host, cfg.ca_pem, cfg.auth.credential().token) == ("https://198.18.0.1:443", CA, "t1")
    v6 = load_in_cluster({"KUBERNETES_SERVICE_HOST": "2001:db8::1", "KUBERNETES_SERVICE_PORT": "6443"}, str(d))
    assert v6.host == "https://[2001:db8::1]:6443"


def test_in_cluster_without_a_service_account_is_a_config_error(tmp_path):
    env = {"KUBERNETES_SERVICE_HOST": "198.18.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubernetesConfigError, match=f"in-cluster service account config: {tmp_path}/ca.crt"):
        load_in_cluster(env, str(tmp_path))
    (tmp_path / "ca.crt").write_bytes(CA)
    with pytest.raises(KubernetesConfigError, match=f"token file {tmp_path}/token"):
        load_in_cluster(env, str(tmp_path))
    with pytest.raises(KubernetesConfigError, match="KUBERNETES_SERVICE_PORT must both be set"):
        load_in_cluster({"KUBERNETES_SERVICE_HOST": "198.18.0.1"}, str(tmp_path))


def test_rotated_token_is_read_again(tmp_path):
    """A kubelet rotation (a new file renamed over the old, like its atomic writer) is seen on the next
    request; an in-place rewrite that looks identical to stat() is seen once the refresh period is over."""
    d = sa_dir(tmp_path, "t1")
    now = [1000.0]
    cfg = load_in_cluster({"KUBERNETES_SERVICE_HOST": "198.18.0.1", "KUBERNETES_SERVICE_PORT": "443"}, str(d),
                          clock=lambda: now[0])
    tok = cfg.auth
    assert tok.credential().token == "t1"
    (d / "token.new").write_text("t2")
    os.replace(d / "token.new", d / "token")
    assert tok.credential().token == "t2"  # another inode: read at once
    st = os.stat(d / "token")
    with open(d / "token", "r+") as f:  # same inode, size and mtime: invisible to stat()
        f.write("t3")
    os.utime(d / "token", ns=(st.st_atime_ns, st.st_mtime_ns))
    now[0] += 59.0
    assert tok.credential().token == "t2"
    now[0] += 1.0  # 60 s after the last read: client-go's period
    assert tok.credential().token == "t3"
    reads = tok.reads
    (d / "token").unlink()  # a failed re-read keeps the last good token
    now[0] += 60.0
    stale: list[str] = []
    tok._on_stale = stale.append
    assert tok.credential().token == "t3" and tok.reads == reads and "token" in stale[0]
