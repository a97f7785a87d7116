# uapi/ — headers only; installed for clients.
# kvd_pins.h (the layout pins) is compiled by the daemon and libkvclient, not installed.
UAPI_HDRS := uapi/kvd.h uapi/kvd_metrics.h
