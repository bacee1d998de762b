"""The device side: what a device does with one task (data, model, local training), in both engines.

A simulated device runs this code inside its leaf's process (``simulation`` calls the task processor); a real
device runs it through NVFlare's device client (``device_processor``). Nothing here knows about NVFlare's wire."""
