"""How long a real device may take before it counts as failed: the constant and the words for it, shared by the
driver (which prints it at the start) and the server (``scheduling.applier`` applies it)."""

from __future__ import annotations

# a real device's timeout before any task is measured (--device-timeout 0: derived)
FIRST_DEVICE_TIMEOUT = 120.0


def device_timeout_words(device_timeout: float) -> str:
    """How long a real device may take, as the driver and the server say it (``scheduling.applier`` applies it)."""
    if device_timeout > 0:
        return f"{device_timeout:g} s (--device-timeout)"
    return (
        f"derived: {FIRST_DEVICE_TIMEOUT:g} s until a task is measured, then 3x the slowest task seen "
        "(--device-timeout S fixes it)"
    )
