"""The edt backend: mq with sch_fq per TX queue, an eBPF departure-time stamper on clsact egress, and its rate controller."""
