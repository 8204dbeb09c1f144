"""The reconciler's view of the kubelet's device assignments: which RDMA devices each pod holds.

Watching the socket: the kubelet removes and recreates
``<kubelet root>/pod-resources/kubelet.sock`` when it restarts. ``poll``
compares the socket file's identity (device, inode, ctime) with the one the
channel was opened on, at the daemon's file-poll cadence (the same loop
tick that polls the tenants file), and drops the channel when it changed,
so the next call connects to the new kubelet at once instead of after
gRPC's reconnect backoff. A failed call drops the channel too, so a
replacement the poll missed is still picked up. Polling rather than
inotify: it is one stat a second in a loop that already runs, it needs
neither ctypes (kept to kernel/) nor a new dependency, and it survives the
directory itself being recreated or mounted late, which an inotify watch
on the directory does not.

A missing socket is "not available": logged once when it goes (or was
never there), not on every reconcile. Failed calls (deadline, UNAVAILABLE,
an unreadable reply) are logged when their message changes; the last good
answer stays in use, and after STALE_AFTER failures in a row a note says
it may be stale. After a failure the next call waits RETRY_S (reset when
the socket is replaced), so a hung kubelet costs one deadline per retry,
not one per reconcile.

Which assignments count as RDMA: a device id that is a PCI address with an
RDMA device under <sys>/bus/pci/devices/<id>/infiniband/ (an SR-IOV VF
bound to mlx5_core, from the SR-IOV network device plugin); whatever the
resource is called. Ids that are not PCI addresses identify no device
(the shared RDMA device plugin hands every pod "0".."N" of a resource such
as rdma/hca_shared_devices_a): for a resource whose name says RDMA (it
contains "rdma", "hca", "roce" or "infiniband") a note says so and the
tenants file's rdma.devices are used instead; other resources (GPUs, ...)
are not RDMA and are ignored.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from shaperd.core import log
from shaperd.core.inventory import Pod
from shaperd.core.roots import DEFAULT, Roots
from shaperd.discovery import rdma as rdma_mod
from shaperd.discovery.podresources.model import PodResources, from_reply

STALE_AFTER = 3
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
_RDMA_WORDS = ("rdma", "hca", "roce", "infiniband")


@dataclass(frozen=True)
class SocketStamp:
    dev: int
    ino: int
    ctime_ns: int  # a socket recreated on a reused inode number still has a new ctime


def socket_stamp(path: str | os.PathLike) -> SocketStamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return SocketStamp(st.st_dev, st.st_ino, st.st_ctime_ns)


def looks_rdma(resource_name: str) -> bool:
    low = resource_name.lower()
    return any(w in low for w in _RDMA_WORDS)


def rdma_assignments(listing: tuple[PodResources, ...], roots: Roots = DEFAULT
                     ) -> tuple[dict[tuple[str, str], tuple[str, ...]], tuple[str, ...]]:
    """(namespace, name) -> the RDMA devices the kubelet assigned to that pod; and notes on ids that name none."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    notes: list[str] = []
    for pod in listing:
        names: set[str] = set()
        unnamed: dict[str, list[str]] = {}
        for c in pod.containers:
            for d in c.devices:
                for i in d.device_ids:
                    if rdma_mod.PCI_ADDRESS_RE.match(i):
                        names.update(rdma_mod.devices_of_pci(i, roots))
                    elif looks_rdma(d.resource_name):
                        unnamed.setdefault(d.resource_name, []).append(i)
        for res, ids in unnamed.items():
            if all(i.isdigit() for i in ids):
                why = "identify no device (shared device plugin)"
            else:
                why = f"({', '.join(sorted(set(ids))[:4])}) are not PCI addresses and identify no device"
            notes.append(f"pod {pod.ref}: resource {res} ids {why}; using the tenants file's rdma.devices")
        if names:
            key = (pod.namespace, pod.name)
            out[key] = tuple(sorted(names | set(out.get(key, ()))))
    return out, tuple(notes)


class PodResourcesSource:
    """Holds one client; ``resolve`` fills Pod.rdma_devices from the kubelet's answer (or the last good one)."""

    def __init__(self, roots: Roots = DEFAULT, timeout_s: float | None = None, *, clock=time.monotonic,
                 client_factory=None):
        self.roots = roots
        self.path = roots.pod_resources_socket
        self.timeout_s = timeout_s
        self.clock = clock
        self.client_factory = client_factory
        self.log = log.get("shaperd.podresources")
        self._client = None
        self._stamp: SocketStamp | None = None
        self._polled = False
        self._retry_at = 0.0
        # The last good answer (None until the kubelet first answered), when, and what was skipped in it.
        self.listing: tuple[PodResources, ...] | None = None
        self.listed_at: float | None = None
        self.problems: tuple[str, ...] = ()
        self.failures = 0  # calls in a row that failed (a vanished socket counts, once we had an answer)
        self.last_error: str | None = None
        self._notes: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return self._stamp is not None

    # -- the socket ------------------------------------------------------------
    def poll(self) -> bool:
        """Look at the socket file; True when it appeared or was replaced (worth a reconcile)."""
        st = socket_stamp(self.path)
        first, self._polled = not self._polled, True
        if st == self._stamp:
            if first and st is None:
                self.log.warning("pod-resources socket not available: pods' RDMA devices from the tenants file only",
                                 socket=str(self.path))
            return False
        old, self._stamp = self._stamp, st
        self._drop()
        if st is None:
            self.log.warning("pod-resources socket gone (kubelet restarting?)", socket=str(self.path),
                             keeping="last good answer" if self.listing is not None else "nothing")
            return False
        self._retry_at = 0.0
        if old is None:
            self.log.info("pod-resources socket available", socket=str(self.path))
        else:
            self.log.info("pod-resources socket replaced (kubelet restart); reconnecting", socket=str(self.path))
        return True

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def close(self) -> None:
        self._drop()

    # -- the call --------------------------------------------------------------
    def fetch(self) -> tuple[PodResources, ...] | None:
        """The kubelet's assignments now, else the last good ones (None: it never answered)."""
        self.poll()
        if self._stamp is None:
            if self.listing is not None:
                self._failed(f"pod-resources: socket {self.path} not available")
            return self.listing
        # grpc (about 20 MiB of RSS) loads only once there is a socket to call: a node with no kubelet
        # pod-resources socket never pays for it.
        from shaperd.discovery.podresources.client import DEFAULT_TIMEOUT_S, PodResourcesClient, PodResourcesError
        now = self.clock()
        if now < self._retry_at:
            return self.listing
        if self._client is None:
            make = self.client_factory or PodResourcesClient
            self._client = make(self.path, self.timeout_s if self.timeout_s is not None else DEFAULT_TIMEOUT_S)
        try:
            reply = self._client.list()
        except PodResourcesError as e:
            self._failed(str(e))
            self._drop()
            self._retry_at = now + RETRY_S[min(self.failures, len(RETRY_S)) - 1]
            return self.listing
        pods, problems = from_reply(reply)
        if self.failures:
            self.log.info("pod-resources answering again", socket=str(self.path), failed_calls=self.failures)
        self.listing, self.problems, self.listed_at = pods, problems, time.time()
        self.failures, self.last_error = 0, None
        return pods

    def _failed(self, msg: str) -> None:
        self.failures += 1
        if msg != self.last_error:
            self.log.warning("pod-resources call failed; enforcement goes on with "
                             + ("the last good answer" if self.listing is not None else "the tenants file only"),
                             error=msg, failed_calls=self.failures)
        self.last_error = msg

    def status_notes(self) -> tuple[str, ...]:
        """What was skipped in the answer in use, and whether it is stale."""
        out = list(self.problems)
        if self.failures >= STALE_AFTER:
            if self.listing is not None:
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.listed_at))
                out.append(f"pod-resources: the kubelet's device assignments in use are from {at} and may be stale: "
                           f"{STALE_AFTER} or more calls in a row failed (last: {self.last_error})")
            else:
                out.append(f"pod-resources: the kubelet has not answered ({self.last_error}); "
                           "pods' RDMA devices from the tenants file's rdma.devices only")
        return tuple(out)

    # -- what the reconciler calls ---------------------------------------------
    def resolve(self, pods: tuple[Pod, ...]) -> tuple[tuple[Pod, ...], tuple[str, ...]]:
        """The pods with rdma_devices from the kubelet's assignments (matched by namespace/name), and notes."""
        listing = self.fetch()
        assigned: dict[tuple[str, str], tuple[str, ...]] = {}
        notes = self.status_notes()
        if listing is not None:
            assigned, more = rdma_assignments(listing, self.roots)
            notes += more
        for n in notes:
            if n not in self._notes:  # said once while it holds, again if it comes back
                self.log.warning("pod-resources note", note=n)
        self._notes = notes
        out = tuple(replace(p, rdma_devices=assigned[(p.namespace, p.name)]) if (p.namespace, p.name) in assigned
                    else p for p in pods)
        return out, notes
