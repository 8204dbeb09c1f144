"""daemonset/components/rdma-webhook/webhook.yaml parses, its pieces name each other consistently, and its arguments suit the CLI."""

from pathlib import Path

import yaml

from shaperd.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def all_docs():
    return list(yaml.safe_load_all((ROOT / "daemonset" / "components" / "rdma-webhook" / "webhook.yaml").read_text()))


def docs():
    """By kind; of the two Issuers and Certificates the last: the CA Issuer and the serving Certificate."""
    return {d["kind"]: d for d in all_docs()}


def named(kind: str, name: str) -> dict:
    (d,) = [d for d in all_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_the_webhook_configuration_is_v1_ignore_no_side_effects_with_an_injected_ca():
    d = docs()
    assert {"ServiceAccount", "Deployment", "Service", "Issuer", "Certificate",
            "MutatingWebhookConfiguration"} <= set(d)
    mwc = d["MutatingWebhookConfiguration"]
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    cert = d["Certificate"]
    # The caBundle from the CA that signs the serving certificate (its Issuer's secret is the CA's).
    ns, ca_name = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    ca = named("Certificate", ca_name)
    assert ns == cert["metadata"]["namespace"] == ca["metadata"]["namespace"] and ca["spec"]["isCA"] is True
    assert d["Issuer"]["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    svc = d["Service"]
    assert hook["clientConfig"]["service"] == {"name": svc["metadata"]["name"],
                                               "namespace": svc["metadata"]["namespace"], "path": "/mutate",
                                               "port": svc["spec"]["ports"][0]["port"]}
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"]["name"] == d["Issuer"]["metadata"]["name"]


def test_the_deployment_runs_the_webhook_command_with_the_certificates_secret_mounted():
    d = docs()
    spec = d["Deployment"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    args = build_parser().parse_args(c["args"])
    assert args.cmd == "webhook" and args.fn.__module__ == "shaperd.webhook"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["tls"]["secret"]["secretName"] == d["Certificate"]["spec"]["secretName"]
    assert mounts["tls"] == args.tls_dir and Path(args.config).parent == Path(mounts["tenants"])
    assert not Path(mounts["tls"]).is_relative_to(mounts["tenants"])  # no mount inside the ConfigMap volume
    assert vols["tenants"]["configMap"]["name"] == "shaperd-tenants"  # the agent's, daemonset/tenants/
    port = next(p for p in c["ports"] if p["name"] == "https")["containerPort"]
    assert args.address == f":{port}" and d["Service"]["spec"]["ports"][0]["targetPort"] == "https"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
