"""RDMA: each tenant's dedicated HCA ports, InfiniBand service level, RoCE traffic class and NCCL settings."""
