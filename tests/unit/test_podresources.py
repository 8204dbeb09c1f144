"""The kubelet pod-resources client against a real gRPC server on a unix socket.

The server implements PodResourcesLister from the checked-in stubs. Covered:
a VF's PCI id maps to its RDMA device through the fixture sysfs tree; the
socket deleted and recreated (a kubelet restart) is reconnected to; the
shared RDMA device plugin's ids give a note and the tenants file's devices;
a server that never answers hits the deadline with a clear error and the
last good answer stays in use (stale after repeated failures); malformed
reply elements are skipped with a message naming the pod; the stubs are
what api.proto compiles to.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from shaperd.core import config
from shaperd.rdma import plan as rdma_plan
from shaperd.discovery import rdma as rdma_mod
from shaperd.discovery.kubernetes import PodInfo
from shaperd.discovery.podresources import api_pb2
from shaperd.discovery.podresources.client import PodResourcesClient, PodResourcesError
from shaperd.discovery.podresources.model import from_reply
from shaperd.discovery.podresources.source import STALE_AFTER, PodResourcesSource, rdma_assignments
from shaperd.engine.reconciler import Reconciler
from shaperd.core.inventory import Capabilities, Inventory, Pod
from shaperd.kernel.rtnl_rows import LinkRow
from shaperd.core.roots import Roots
from shaperd.core.tenancy import tenancy

from ..podresources_fake import Kubelet, Lister
from ..rdma_fixture import Node

REPO = Path(__file__).resolve().parents[2]
VF0, VF1 = "0000:3b:00.2", "0000:3b:00.3"  # mlx5_2, mlx5_3 in the fixture


def reply(*pods) -> api_pb2.ListPodResourcesResponse:
    """pods: (namespace, name, {container: [(resource, [ids])]})."""
    out = api_pb2.ListPodResourcesResponse()
    for ns, name, containers in pods:
        p = out.pod_resources.add(name=name, namespace=ns)
        for cname, devices in containers.items():
            c = p.containers.add(name=cname)
            for res, ids in devices:
                c.devices.add(resource_name=res, device_ids=ids)
    return out


@pytest.fixture
def roots(tmp_path):
    # The kubelet root in a short directory: a unix socket path is limited to 107 bytes.
    kubelet = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield Roots.of(sys=str(Node(tmp_path).build().sys), kubelet=str(kubelet))
    shutil.rmtree(kubelet, ignore_errors=True)


@pytest.fixture
def kubelet(roots):
    k = Kubelet(roots.pod_resources_socket)
    yield k
    k.stop()


def wait_until(cond, timeout_s=5.0):
    """Poll a condition until it holds (fails the test after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def pods(*refs: str) -> tuple[Pod, ...]:
    return tuple(Pod(uid=f"uid-{r}", namespace=r.split("/")[0], name=r.split("/")[1]) for r in refs)


def rdma_of(resolved: tuple[Pod, ...]) -> dict[str, tuple[str, ...]]:
    return {p.ref: p.rdma_devices for p in resolved}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


# -- the client and the mapping --------------------------------------------------


def test_list_maps_a_vf_pci_id_to_its_rdma_device(roots, kubelet):
    kubelet.start(Lister(reply(
        ("team-a", "trainer-0", {"main": [("nvidia.com/sriov_rdma_vf", [VF0]), ("nvidia.com/gpu", ["GPU-8f3a"])]}),
        ("team-b", "web", {"main": []}),
    )))
    got = PodResourcesClient(roots.pod_resources_socket, timeout_s=5).list()
    assert [(p.namespace, p.name) for p in got.pod_resources] == [("team-a", "trainer-0"), ("team-b", "web")]

    src = PodResourcesSource(roots, timeout_s=5)
    resolved, notes = src.resolve(pods("team-a/trainer-0", "team-b/web", "team-c/not-listed"))
    assert rdma_of(resolved) == {"team-a/trainer-0": ("mlx5_2",), "team-b/web": (), "team-c/not-listed": ()}
    assert notes == ()  # the GPU's id is not a PCI address, and the resource is no RDMA one: ignored quietly
    src.close()


def test_which_ids_count_as_rdma(tmp_path):
    node = Node(tmp_path).build()
    node.pci_function("0000:af:00.1")  # a PCI function with no RDMA device (a plain netdevice VF)
    roots = Roots.of(sys=str(node.sys))
    listing, _ = from_reply(reply(
        ("ns", "a", {"c1": [("intel.com/sriov_netdevice", ["0000:af:00.1"]), ("x.io/vf", [VF1.upper()])],
                     "c2": [("openshift.io/mlx_rdma", [VF0])]}),
        ("ns", "b", {"c": [("example.com/roce_vf", ["vf-7"])]}),
    ))
    assigned, notes = rdma_assignments(listing, roots)
    assert assigned == {("ns", "a"): ("mlx5_2", "mlx5_3")}  # upper-case hex is the same function
    assert notes == ("pod ns/b: resource example.com/roce_vf ids (vf-7) are not PCI addresses and identify no "
                     "device; using the tenants file's rdma.devices",)
    assert rdma_mod.devices_of_pci("0000:af:00.1", roots) == () and rdma_mod.devices_of_pci("../x", roots) == ()


# -- kubelet restart -------------------------------------------------------------


def test_socket_deleted_and_recreated_is_reconnected(roots, kubelet):
    first = Lister(reply(("ns", "x", {"c": [("nvidia.com/rdma_vf", [VF0])]})))
    kubelet.start(first)
    src = PodResourcesSource(roots, timeout_s=5)
    assert src.poll() is True  # the socket appeared
    assert rdma_of(src.resolve(pods("ns/x"))[0]) == {"ns/x": ("mlx5_2",)}

    kubelet.stop()  # the kubelet goes away and takes its socket with it
    wait_until(lambda: not src.poll() and not src.available)
    resolved, notes = src.resolve(pods("ns/x"))
    assert rdma_of(resolved) == {"ns/x": ("mlx5_2",)}  # the last good answer, while there is no kubelet
    assert notes == ()  # one failure is not yet "stale"

    second = Lister(reply(("ns", "x", {"c": [("nvidia.com/rdma_vf", [VF1])]})))
    kubelet.start(second)  # the new kubelet, a new socket at the same path
    wait_until(src.poll)
    assert rdma_of(src.resolve(pods("ns/x"))[0]) == {"ns/x": ("mlx5_3",)}
    assert (src.failures, second.calls) == (0, 1)

    # Replaced between two polls (no gap seen): the new inode is noticed and the new server asked.
    kubelet.stop()
    third = Lister(reply(("ns", "x", {"c": [("nvidia.com/rdma_vf", [VF0, VF1])]})))
    kubelet.start(third)
    wait_until(src.poll)
    assert rdma_of(src.resolve(pods("ns/x"))[0]) == {"ns/x": ("mlx5_2", "mlx5_3")}
    assert third.calls == 1
    src.close()


def test_missing_socket_is_not_available_logged_once(roots):
    src = PodResourcesSource(roots, timeout_s=5)
    with capture_logs() as logs:
        for _ in range(5):
            src.poll()
            resolved, notes = src.resolve(pods("ns/x"))
    assert rdma_of(resolved) == {"ns/x": ()} and notes == ()
    assert [e["event"] for e in logs] == [
        "pod-resources socket not available: pods' RDMA devices from the tenants file only"]
    assert logs[0]["socket"] == str(roots.pod_resources_socket)


def test_no_socket_no_grpc(tmp_path):
    """grpc (about 20 MiB of RSS) is loaded only once there is a socket to call."""
    import sys

    from tests import procs
    code = ("import sys\nfrom shaperd.core.roots import Roots\n"
            "from shaperd.discovery.podresources.source import PodResourcesSource\n"
            f"src = PodResourcesSource(Roots.of(kubelet={str(tmp_path)!r}), timeout_s=5)\n"
            "print(src.fetch(), src.available, 'grpc' in sys.modules)")
    out = procs.run([sys.executable, "-c", code], timeout_s=120).stdout
    assert out.strip().splitlines()[-1].split() == ["None", "False", "False"]  # (the log line comes first)


# -- the shared device plugin ----------------------------------------------------

CFG = """
tenants:
  - name: tenant-a
    bandwidthGuarantee: 10Gbps
    match: {namespaces: [ns]}
    rdma: {devices: ["mlx5_1"]}
"""


def test_shared_plugin_ids_give_a_note_and_the_tenants_file_devices(roots, kubelet):
    kubelet.start(Lister(reply(("ns", "x", {
        "a": [("rdma/hca_shared_devices_a", ["0"])], "b": [("rdma/hca_shared_devices_a", ["3", "4"])]}))))
    src = PodResourcesSource(roots, timeout_s=5)
    with capture_logs() as logs:
        resolved, notes = src.resolve(pods("ns/x"))
        src.resolve(pods("ns/x"))  # the same note is not logged again
    note = ("pod ns/x: resource rdma/hca_shared_devices_a ids identify no device (shared device plugin); "
            "using the tenants file's rdma.devices")
    assert notes == (note,) and rdma_of(resolved) == {"ns/x": ()}
    assert [e.get("note") for e in logs if e["event"] == "pod-resources note"] == [note]

    cfg = config.load_text(CFG)
    devs, dnotes = rdma_mod.discover(roots)
    inv = Inventory(rdma=devs, rdma_notes=dnotes + notes, pods=resolved)
    p = rdma_plan.plan(cfg, inv, tenancy(cfg, inv))
    assert [x.ref for x in p.tenant("tenant-a").ports] == ["mlx5_1:1"]  # from the tenants file
    assert note in p.warnings
    src.close()


# -- failures --------------------------------------------------------------------


def test_server_that_never_answers_hits_the_deadline(roots, kubelet):
    lister = Lister(reply(("ns", "x", {"c": [("nvidia.com/rdma_vf", [VF0])]})))
    lister.stall = True
    kubelet.start(lister)
    client = PodResourcesClient(roots.pod_resources_socket, timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(PodResourcesError) as err:
        client.list()
    assert time.monotonic() - start < 3
    assert str(err.value) == (f"pod-resources List on unix://{roots.pod_resources_socket}: "
                              "no answer within 0.2 s (deadline exceeded)")
    client.close()


def test_failures_keep_the_last_good_answer_then_mark_it_stale(roots, kubelet):
    lister = Lister(reply(("ns", "x", {"c": [("nvidia.com/rdma_vf", [VF0])]})))
    kubelet.start(lister)
    clock = Clock()
    # 2 s, not less: the answered calls (the first and the last) must fit the same deadline on a busy
    # machine (0.2 s failed once under load); only the stalled ones are meant to hit it.
    src = PodResourcesSource(roots, timeout_s=2.0, clock=clock)
    assert rdma_of(src.resolve(pods("ns/x"))[0]) == {"ns/x": ("mlx5_2",)}

    lister.stall = True
    with capture_logs() as logs:
        for n in range(1, STALE_AFTER + 1):
            resolved, notes = src.resolve(pods("ns/x"))
            assert rdma_of(resolved) == {"ns/x": ("mlx5_2",)} and src.failures == n
            assert src.resolve(pods("ns/x"))[0] == resolved  # backing off: no second call yet
            clock.t += 60
    assert lister.calls == 1 + STALE_AFTER
    assert len(notes) == 1 and "may be stale" in notes[0] and "deadline exceeded" in notes[0]
    assert str(roots.pod_resources_socket) in notes[0]
    failed = [e for e in logs if e["event"].startswith("pod-resources call failed")]
    assert len(failed) == 1 and "List on unix://" in failed[0]["error"]  # the same error is logged once

    lister.stall = False
    lister.release.set()
    resolved, notes = src.resolve(pods("ns/x"))
    assert notes == () and src.failures == 0 and rdma_of(resolved) == {"ns/x": ("mlx5_2",)}
    src.close()


def test_a_socket_nobody_listens_on_is_unavailable(roots):
    """A kubelet that died without removing its socket: connection refused, said as UNAVAILABLE."""
    import socket

    path = roots.pod_resources_socket
    path.parent.mkdir(parents=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nothing listens
    client = PodResourcesClient(path, timeout_s=5)
    with pytest.raises(PodResourcesError) as err:
        client.list()
    msg = str(err.value)
    assert msg.startswith(f"pod-resources List on unix://{path}: unavailable (is the kubelet running?)"), msg
    client.close()


def test_a_reply_that_is_no_list_response_is_a_clear_error(roots, kubelet):
    garbage = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"\xff\xff\xff\xff")})
    kubelet.start(handler=garbage)
    client = PodResourcesClient(roots.pod_resources_socket, timeout_s=5)
    with pytest.raises(PodResourcesError) as err:
        client.list()
    msg = str(err.value)
    assert msg.startswith(f"pod-resources List on unix://{roots.pod_resources_socket}: bad reply"), msg
    client.close()


def test_malformed_elements_are_skipped_with_a_message_naming_the_pod(roots, kubelet):
    kubelet.start(Lister(reply(
        ("ns", "", {"c": [("nvidia.com/rdma_vf", [VF0])]}),
        ("ns", "y", {"c": [("", [VF0]), ("nvidia.com/rdma_vf", [VF1]), ("nvidia.com/rdma_vf", [""])]}),
    )))
    src = PodResourcesSource(roots, timeout_s=5)
    resolved, notes = src.resolve(pods("ns/y"))
    assert rdma_of(resolved) == {"ns/y": ("mlx5_3",)}
    assert notes == (
        "pod-resources: pod ns/? (pod_resources[0]) has no name; skipped",
        "pod-resources: pod ns/y container c devices[0] has no resource_name; skipped",
        "pod-resources: pod ns/y container c devices[2] (nvidia.com/rdma_vf) has an empty device id; skipped",
    )
    src.close()


# -- wiring ----------------------------------------------------------------------


class FakeReader:
    def links(self):
        return [LinkRow(1, "lo", "", 65536, True)]

    def routes(self, family):
        return []


class FakeSource:
    def __init__(self):
        self.asked = []

    def resolve(self, pods):
        self.asked.append(tuple(p.ref for p in pods))
        return tuple(p.__class__(**{**p.__dict__, "rdma_devices": ("mlx5_2",)}) for p in pods), ("a note",)


def test_the_reconciler_fills_pods_rdma_devices_and_notes(tmp_path):
    roots = Roots.of(sys=str(Node(tmp_path).build().sys), proc=str(tmp_path / "proc"))
    info = PodInfo(uid="u1", namespace="ns", name="x", labels={}, ips=(), host_network=False, qos_class=None,
                   phase="Running", node="n1")
    src = FakeSource()
    rec = Reconciler(FakeReader(), [], Capabilities(), roots=roots, pods_source=lambda: [info], pod_resources=src)
    inv = rec.inventory()
    assert [(p.ref, p.rdma_devices) for p in inv.pods] == [("ns/x", ("mlx5_2",))]
    assert inv.rdma_notes[-1] == "a note" and src.asked == [("ns/x",)]

    bare = Reconciler(FakeReader(), [], Capabilities(), roots=roots, pods_source=lambda: [], pod_resources=src)
    assert bare.inventory().pods == () and len(src.asked) == 1  # no pods: the kubelet is not asked


def test_run_has_a_no_pod_resources_flag():
    from shaperd.cli.main import build_parser

    assert build_parser().parse_args(["run", "--no-pod-resources"]).no_pod_resources is True
    assert build_parser().parse_args(["run"]).no_pod_resources is False


# -- the stubs -------------------------------------------------------------------


def test_checked_in_stubs_are_what_api_proto_compiles_to(tmp_path):
    """api_pb2.py carries the compiled descriptor; compiling api.proto again must give the same bytes."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    rc = protoc.main(["protoc", "-I", str(REPO), f"--descriptor_set_out={out}",
                      "shaperd/discovery/podresources/api.proto"])
    assert rc == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for m in compiled.message_type:  # protoc fills in json_name for descriptor sets; gencode leaves it out
        for fld in m.field:
            fld.ClearField("json_name")
    assert compiled == descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    # The wire contract with the kubelet: the service's full name and its methods.
    svc = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert [m.name for m in svc.methods] == ["List", "GetAllocatableResources", "Get"]
    f = api_pb2.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (f["resource_name"].number, f["device_ids"].number) == (1, 2)
