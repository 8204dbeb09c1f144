"""The shared RDMA model: the RDMA plan (SL and TC ranks per tenant), NCCL settings, OpenSM options, the SM check.

Used by the RDMA backends (nccl, dcb, devlink, vfrate), the webhook and status; never a backend itself.
"""
