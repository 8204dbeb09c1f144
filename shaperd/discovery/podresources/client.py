"""One gRPC client of the kubelet's pod-resources v1 API on its unix socket.

Every call carries a deadline. Failures come back as PodResourcesError,
whose message names the socket and the call ("pod-resources List on
unix:///var/lib/kubelet/pod-resources/kubelet.sock: ..."). The channel is
opened on first use and dropped by ``close``: the source (source.py) closes
it when the socket file is replaced or a call fails, so the next call
connects afresh instead of waiting out gRPC's reconnect backoff.
"""

from __future__ import annotations

import os

import grpc

from shaperd.core.errors import DiscoveryError
from shaperd.discovery.podresources import api_pb2, api_pb2_grpc

DEFAULT_TIMEOUT_S = 2.0
# The kubelet answers List with every pod on the node; its own client allows 16 MiB (gRPC's default is 4).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesError(DiscoveryError):
    """A pod-resources call failed: no answer in time, unavailable, or a reply that could not be read."""


class PodResourcesClient:
    def __init__(self, socket_path: str | os.PathLike, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.path = os.path.abspath(os.fspath(socket_path))
        self.target = f"unix://{self.path}"
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _lister(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(self.target, options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ])
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def list(self) -> api_pb2.ListPodResourcesResponse:
        """Every pod on the node with the devices of its containers."""
        try:
            return self._lister().List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise PodResourcesError(f"pod-resources List on {self.target}: {self._cause(e)}") from e

    def _cause(self, e: grpc.RpcError) -> str:
        code = e.code() if hasattr(e, "code") else None
        details = (e.details() if hasattr(e, "details") else None) or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer within {self.timeout_s:g} s (deadline exceeded)"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"unavailable (is the kubelet running?): {details}".rstrip(": ")
        if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
            return f"bad reply: not a ListPodResourcesResponse ({details})"
        name = code.name if code is not None else "error"
        return f"{name}: {details}" if details else name

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None
