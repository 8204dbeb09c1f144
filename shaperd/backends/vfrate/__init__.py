"""SR-IOV VF rates: each tenant's VFs get min_tx_rate/max_tx_rate on their PF (docs/rdma.md)."""
