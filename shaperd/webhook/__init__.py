"""``shaperd webhook``: the mutating admission webhook that adds each tenant's NCCL settings to its pods.

Runs as its own Deployment (daemonset/components/rdma-webhook/webhook.yaml), not in the node agent:
it needs no host access and no API access, only the tenants file and a
serving certificate. ``admission`` decides (pure), ``reload`` follows the
certificate and the tenants file, ``server`` speaks HTTPS. This module only
adds the command's arguments; the rest loads when the command runs.
"""

from __future__ import annotations

DEFAULT_CONFIG = "/etc/shaperd/traffic-shaping.yaml"
DEFAULT_TLS_DIR = "/etc/shaperd-webhook/tls"
DEFAULT_ADDRESS = ":8443"


def add_arguments(p) -> None:
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"tenants file (default {DEFAULT_CONFIG})")
    p.add_argument("--tls-dir", default=DEFAULT_TLS_DIR,
                   help="directory holding tls.crt and tls.key, e.g. a mounted cert-manager Secret; "
                        f"reloaded when they change (default {DEFAULT_TLS_DIR})")
    p.add_argument("--address", default=DEFAULT_ADDRESS, metavar="HOST:PORT",
                   help=f"where to serve HTTPS (default {DEFAULT_ADDRESS}, all interfaces)")
    p.add_argument("--read-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a request's handshake, headers and body must each arrive within this (default 10)")
    p.add_argument("--env-from", choices=("skip", "add"), default="skip",
                   help="containers with envFrom: skip them (default; their keys are not visible here and an env "
                        "entry would override them) or add the variables anyway")
    p.set_defaults(fn=main)


def main(args) -> int:
    import signal
    import threading

    from shaperd.core import log
    from shaperd.core.errors import ShaperdError
    from shaperd.webhook.admission import Mutator
    from shaperd.webhook.reload import TenantsFile, TlsFiles
    from shaperd.webhook.server import WebhookServer

    tls = TlsFiles(args.tls_dir)
    tenants = TenantsFile(args.config, lambda cfg: Mutator(cfg, args.env_from))
    tenants.current()  # load now, so a bad file is logged at start
    try:
        srv = WebhookServer(args.address, tls, tenants, args.read_timeout)
    except (OSError, ValueError) as e:
        raise ShaperdError(f"listen on {args.address}: {getattr(e, 'strerror', None) or e}") from e
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv.start()
    host, port = srv.address
    log.get("shaperd.webhook").info("listening", address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                    tls_dir=args.tls_dir, config=args.config, env_from=args.env_from)
    stop.wait()
    srv.stop()
    log.get("shaperd.webhook").info("stopped")
    return 0
