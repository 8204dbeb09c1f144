"""The kubelet's List reply as plain data: pods, their containers, and each container's devices.

``from_reply`` accepts anything shaped like ``api_pb2.ListPodResourcesResponse``
(attributes, not the generated class, so tests and future API versions need
no stubs). An element that cannot be used is skipped and described in a
message naming the pod; the rest of the reply is kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str  # the device plugin's resource, "nvidia.com/sriov_rdma_vf"
    device_ids: tuple[str, ...]  # what the plugin calls them (PCI addresses for SR-IOV VFs)


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def from_reply(reply) -> tuple[tuple[PodResources, ...], tuple[str, ...]]:
    """(usable pods, messages about the elements skipped)."""
    pods: list[PodResources] = []
    problems: list[str] = []
    for i, p in enumerate(reply.pod_resources):
        name, ns = p.name, p.namespace
        if not name or not ns:
            what = f"pod {ns or '?'}/{name or '?'} (pod_resources[{i}])"
            problems.append(f"pod-resources: {what} has no {'name' if not name else 'namespace'}; skipped")
            continue
        ref = f"{ns}/{name}"
        containers = []
        for c in p.containers:
            devices = []
            for j, d in enumerate(c.devices):
                where = f"pod {ref} container {c.name or '?'} devices[{j}]"
                if not d.resource_name:
                    problems.append(f"pod-resources: {where} has no resource_name; skipped")
                    continue
                ids = tuple(d.device_ids)
                if not ids or any(not x.strip() for x in ids):
                    problems.append(f"pod-resources: {where} ({d.resource_name}) has an empty device id; skipped")
                    continue
                devices.append(ContainerDevices(d.resource_name, ids))
            containers.append(ContainerResources(c.name, tuple(devices)))
        pods.append(PodResources(name, ns, tuple(containers)))
    return tuple(pods), tuple(problems)
