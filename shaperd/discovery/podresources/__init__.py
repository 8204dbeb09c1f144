"""Which devices the kubelet gave each pod: its pod-resources v1 gRPC API on a local unix socket.

- api.proto: the kubelet's schema (upstream's names and field numbers);
  api_pb2.py, api_pb2_grpc.py: generated from it by scripts/gen-podresources.
- model.py: the reply as plain data, malformed elements skipped and named.
- client.py: one List call with a deadline; gRPC failures as PodResourcesError.
- source.py: what the reconciler holds: watches the socket, keeps the last
  good answer, maps SR-IOV VF ids to RDMA devices through sysfs.

A gRPC client on a unix socket is not a kernel interface, so this lives in
discovery/, not kernel/. Nothing here is imported unless Kubernetes
discovery is on (grpc loads with client.py).
"""
