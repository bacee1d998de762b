"""The server process, its side of exact simulated time: which device trains which model version, and when its
update is applied.

The time model is a pure state machine (``schedule``, over the ``device_pool`` and a method's ``selection``
policy); ``event_reference`` runs it alone (the trace a real run must reproduce) and ``timeline`` plans a dry run
with it in the driver. On the server, ``exact_assessor`` (the NVFlare component) and its ``applier`` thread drive
it, with ``child_reply``, ``waker``, ``leaf_watch``, ``failure_streak`` and ``checkpoint`` beside them."""
