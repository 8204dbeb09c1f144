"""RoCE DCB traffic classes (IEEE 802.1Qaz ETS, max rates, DSCP APP table) on the RoCE uplinks."""
