"""A fake kubelet pod-resources v1 server on a unix socket, for tests and benchmarks.

``Lister`` answers List with a fixed reply (or stalls until released); ``Kubelet`` serves it on
<root>/pod-resources/kubelet.sock and removes the socket on stop, as a kubelet going away does.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from shaperd.discovery.podresources import api_pb2, api_pb2_grpc


class Lister(api_pb2_grpc.PodResourcesListerServicer):
    """A kubelet: answers List with ``self.reply``; with ``stall`` set, answers nothing until released."""

    def __init__(self, answer=None):
        self.reply = answer if answer is not None else api_pb2.ListPodResourcesResponse()
        self.calls = 0
        self.stall = False
        self.release = threading.Event()

    def List(self, request, context):
        self.calls += 1
        if self.stall:
            self.release.wait(10)
        return self.reply


class Kubelet:
    """A gRPC server on <root>/pod-resources/kubelet.sock, started and stopped like the kubelet."""

    def __init__(self, socket: Path):
        self.socket = socket
        self.server = None

    def start(self, servicer=None, handler=None) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if servicer is not None:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, self.server)
        if handler is not None:
            self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        self.servicer = servicer

    def stop(self) -> None:
        """Stop and remove the socket, as a kubelet going away does (it recreates it on start)."""
        if self.server is not None:
            if getattr(self, "servicer", None) is not None:
                self.servicer.release.set()
            self.server.stop(None).wait(5)
            self.server = None
        self.socket.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """``python -m tests.podresources_fake SOCKET``: serve an empty List on SOCKET until stdin closes, then
    print the number of calls. A process of its own, so that whoever starts it can fork without gRPC's
    threads in it (bench/pod_churn.py --kubelet)."""
    import sys

    kubelet = Kubelet(Path(argv[0]))
    kubelet.start(Lister())
    print("serving", flush=True)
    sys.stdin.read()
    calls = kubelet.servicer.calls
    kubelet.stop()
    print(calls, flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
