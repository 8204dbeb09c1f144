"""devlink rate groups: one rate node per tenant on each switchdev NIC, the tenant's VF ports as its leaves."""
