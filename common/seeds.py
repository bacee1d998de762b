"""Seeds from names: the same integer in every process and on every machine (never Python's salted ``hash()``)."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from any printable parts, identical across processes and machines."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")
