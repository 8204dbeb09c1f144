"""NCCL settings per tenant: an environment file each (NCCL_IB_HCA, NCCL_IB_SL, NCCL_IB_TC) for the pods to source."""
