"""A tenant's NCCL environment, pure: which variables, their values, and the forms they are printed in.

From the tenant's RDMA plan (``plan.TenantRdma``):

- ``NCCL_IB_HCA``: its ports on this node as ``=mlx5_0:1,mlx5_2:1``. NCCL reads
  one leading ``=`` as "the tokens are exact names" (after an optional ``^``);
  without it each token is a prefix, and ``mlx5_1`` would also select ``mlx5_10``.
- ``NCCL_IB_SL``: its service level.
- ``NCCL_IB_TC``: its traffic class, where it has a RoCE port here or no port at
  all (the link layer is then unknown; on InfiniBand NCCL puts the TC only in a
  GRH, which paths inside one subnet do not carry, so it does no harm there).
  Left out when every port it has here is InfiniBand.
- ``NCCL_IB_GID_INDEX``: the RoCE v2 GID index, when every RoCE port of the
  tenant has one and it is the same (NCCL takes one index for all devices).
- ``NCCL_SOCKET_IFNAME``: ``match.interfaces`` without globs, in the exact ``=`` form.
- the tenant's ``rdma.nccl`` passthrough values. The config refuses the three
  derived names; for the GID index and the socket interface an explicit value wins.

``node=False`` keeps only what holds on every node (SL, TC whatever the link
layer, passthrough): what the admission webhook adds to pods. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

import yaml

from shaperd.rdma.plan import TenantRdma

# What only this node knows (device names, GID table slots, interface names).
NODE_SPECIFIC = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")
CONFIGMAP_PREFIX = "shaperd-nccl-"


@dataclass(frozen=True)
class NcclEnv:
    tenant: str
    values: dict[str, str] = field(default_factory=dict)  # in the order they are printed
    notes: tuple[str, ...] = ()  # why a variable is not set


def tenant_env(t: TenantRdma, node: bool = True) -> NcclEnv:
    values: dict[str, str] = {}
    notes: list[str] = []
    if node:
        if t.ports:
            values["NCCL_IB_HCA"] = "=" + ",".join(p.ref for p in t.ports)
        else:
            notes.append(f"NCCL_IB_HCA is not set: tenant {t.tenant} holds no RDMA device on this node (none of "
                         "its rdma.devices is here and no pod of it was assigned one); NCCL picks HCAs itself")
    values["NCCL_IB_SL"] = str(t.service_level)
    if t.roce or not t.ports or not node:
        values["NCCL_IB_TC"] = str(t.traffic_class)
    if node:
        gid, why = _gid_index(t)
        if gid is not None:
            values["NCCL_IB_GID_INDEX"] = str(gid)
        elif why:
            notes.append(f"NCCL_IB_GID_INDEX is not set: {why}")
        if t.socket_ifname:
            values["NCCL_SOCKET_IFNAME"] = "=" + t.socket_ifname
    for k in sorted(t.nccl):
        if node or k not in NODE_SPECIFIC:
            values[k] = t.nccl[k]
    return NcclEnv(t.tenant, values, tuple(notes))


def _gid_index(t: TenantRdma) -> tuple[int | None, str | None]:
    roce = [p for p in t.ports if p.link_layer == "Ethernet"]
    if not roce:
        return None, None
    found = {p.ref: p.roce_v2_gid_index for p in roce}
    missing = [ref for ref, i in found.items() if i is None]
    if missing:
        return None, f"{', '.join(missing)} has no RoCE v2 GID"
    if len(set(found.values())) > 1:
        at = ", ".join(f"{ref} at {i}" for ref, i in found.items())
        return None, f"the tenant's RoCE ports have their RoCE v2 GID at different indexes ({at}); NCCL takes one"
    return next(iter(found.values())), None


# -- the forms it is printed in ---------------------------------------------------------------------

def shell(env: NcclEnv) -> str:
    """``export K='V'`` lines, each value single-quoted for a POSIX shell (``K==mlx5_0:1`` is valid but reads
    like a typo)."""
    return "".join(f"export {k}={_single_quoted(v)}\n" for k, v in env.values.items())


def _single_quoted(v: str) -> str:
    q = shlex.quote(v)
    return q if q.startswith("'") else f"'{v}'"  # shlex left it bare: it holds no quote, wrapping is exact


def json_text(env: NcclEnv) -> str:
    return json.dumps(env.values, indent=2) + "\n"


def configmap_name(tenant: str) -> str:
    """A DNS-subdomain ConfigMap name for a tenant (tenant names may hold '_' and capitals)."""
    return CONFIGMAP_PREFIX + re.sub(r"[^a-z0-9.-]", "-", tenant.lower())


def configmap(env: NcclEnv) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(env.tenant),
            "labels": {"app.kubernetes.io/managed-by": "shaperd", "shaperd.io/tenant": env.tenant},
        },
        "data": {k: _Quoted(v) for k, v in env.values.items()},
    }
    node = [k for k in env.values if k in NODE_SPECIFIC]
    head = f"# {', '.join(node)}: as on the node this was printed on\n" if node else ""
    return head + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Quoted(str):
    """A ConfigMap value: always quoted, so "3" stays a string and "=mlx5_0:1" reads as one to every parser."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"'))


def header(tenant: str) -> str:
    """The first line of every env file shaperd writes: its mark of ownership."""
    return f"# shaperd: NCCL environment of tenant {tenant}; written by shaperd, do not edit"


def env_file(env: NcclEnv) -> bytes:
    """An env file: ``K=V`` lines with shell quoting, readable by ``set -a; . FILE``, systemd's
    EnvironmentFile= and ``docker --env-file`` (for values that need no quotes). Deterministic, so a
    reconcile can compare it byte for byte."""
    lines = [header(env.tenant)]
    lines += [f"# {n}" for n in env.notes]
    lines += [f"{k}={shlex.quote(v)}" for k, v in env.values.items()]
    return ("\n".join(lines) + "\n").encode()
