"""What is on this node: links, pods and their interfaces, cgroups, RDMA devices, the Kubernetes and kubelet APIs."""
