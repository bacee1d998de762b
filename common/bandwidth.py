"""A fleet's link bandwidths (``--uplink-kbps``, ``--downlink-kbps``): one value for every device, or a distribution
each device's own bandwidth is drawn from, once, seeded by the run's seed and its id (``docs/communication.md``).

A setting is a number (kbit/s, every device) or, as ``--compress`` names its compressor, ``NAME:A:B``:

* ``lognormal:MEDIAN:SIGMA``: log-normal with that median (kbit/s) and the standard deviation ``SIGMA`` of its
  natural log (0: every device at the median), the long-tailed spread of measured mobile links;
* ``uniform:LOW:HIGH``: uniform between two bandwidths;
* ``A,B,...``: one of the values, with equal probability, as ``--upload-delays`` draws a device's upload mean.

A device's draw comes from a generator seeded with ``stable_seed("bandwidth", link, seed, device)``, so the server,
the dry-run planner and the event reference give every device the same bandwidth in any order and any process.
A number stays a float (a run with one bandwidth records and times exactly what it did before distributions).
Parsing needs only the standard library; a draw imports numpy.
"""

from __future__ import annotations

import math

from common.choices import ConfigError
from common.seeds import stable_seed

Bandwidth = float | str  # kbit/s for every device, or a distribution's canonical text
DISTRIBUTIONS = ("lognormal", "uniform")
FORMS = "a number of kbit/s > 0, lognormal:MEDIAN:SIGMA, uniform:LOW:HIGH or A,B,... (docs/communication.md)"


def _number(flag: str, text: str, part: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {part!r} is not a number; give {FORMS}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{flag} {text!r}: {part!r} is not a finite number; give {FORMS}")
    return value


def parse_bandwidth(flag: str, value: float | str) -> Bandwidth:
    """``value`` in its canonical form (a float, or ``lognormal:500:1``-style text); ``ConfigError`` in one line
    naming the fix for a bandwidth <= 0, a malformed distribution or an unknown one."""
    if isinstance(value, bool):
        raise ConfigError(f"{flag} {value!r}: give {FORMS}")
    if isinstance(value, int | float):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value:g}: a bandwidth in kbit/s must be > 0; give {FORMS}")
        return float(value)
    text = str(value).strip()
    name, colon, rest = text.partition(":")
    if not colon:
        values = [_number(flag, text, p.strip()) for p in text.split(",")]
        if len(values) == 1:
            return parse_bandwidth(flag, values[0])
        if any(v <= 0 for v in values):
            raise ConfigError(f"{flag} {text!r}: every bandwidth in kbit/s must be > 0")
        return ",".join(repr(v) for v in values)
    name = name.strip().lower()
    if name not in DISTRIBUTIONS:
        raise ConfigError(f"{flag} {text!r}: unknown distribution {name!r}; give {FORMS}")
    parts = rest.split(":")
    if len(parts) != 2:
        form = "lognormal:MEDIAN:SIGMA" if name == "lognormal" else "uniform:LOW:HIGH"
        raise ConfigError(f"{flag} {text!r}: {name} takes two numbers, {form} (e.g. {name}:500:1)")
    a, b = (_number(flag, text, p.strip()) for p in parts)
    if name == "lognormal" and not (a > 0 and b >= 0):
        raise ConfigError(f"{flag} {text!r}: lognormal's median must be > 0 kbit/s and its sigma >= 0")
    if name == "uniform" and not 0 < a <= b:
        raise ConfigError(f"{flag} {text!r}: uniform:LOW:HIGH needs 0 < LOW <= HIGH kbit/s")
    return f"{name}:{a!r}:{b!r}"


def device_bandwidth(setting: Bandwidth, seed: int, device_id: str, link: str) -> float:
    """The bandwidth (kbit/s) of ``device_id``'s ``link`` (``up`` or ``down``) under ``setting`` (canonical, from
    ``parse_bandwidth``): the number itself, or the device's one draw from the distribution."""
    if isinstance(setting, int | float):
        return float(setting)
    import numpy as np  # here: the config parts that parse a setting stay free of numpy

    rng = np.random.default_rng(stable_seed("bandwidth", link, seed, device_id))
    name, _, rest = setting.partition(":")
    if not rest:
        values = [float(v) for v in setting.split(",")]
        return values[int(rng.integers(len(values)))]
    a, b = (float(p) for p in rest.split(":"))
    if name == "lognormal":
        return float(a * math.exp(b * rng.standard_normal()))
    return float(rng.uniform(a, b))
