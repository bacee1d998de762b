"""Names shared by the device side, the leaves and the server: keys carried inside NVFlare's messages."""

# result metadata naming the device, so leaves and the server can tell per-device updates apart
DEVICE_ID_META = "edgesim_device_id"
