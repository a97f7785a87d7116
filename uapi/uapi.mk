# uapi/ — headers only; installed for clients.
UAPI_HDRS := uapi/kvd.h uapi/kvd_metrics.h
