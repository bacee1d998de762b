"""Configuration errors and closed sets of choices, each choice checked in one place.

A choice is a ``typing.Literal``: the same type annotates the config field, feeds argparse ``choices`` and is
what ``check_choice`` validates against, so a new value is added in one place.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

# when the server's evaluation falls behind the versions made (``evaluation.evaluator``; ``--eval-backlog``)
EvalBacklog = Literal["skip", "wait"]


class ConfigError(ValueError):
    """A configuration the job would hang on or misbehave with; the message names the fix."""


def literal_choices(literal: Any) -> tuple[str, ...]:
    """The values of a ``Literal[...]`` type, in declaration order."""
    return tuple(get_args(literal))


def check_choice(flag: str, value: object, literal: Any) -> None:
    """Raise ``ConfigError`` naming ``flag`` and its valid values unless ``value`` is one of them."""
    choices = literal_choices(literal)
    if value not in choices:
        raise ConfigError(f"{flag} {value!r}: use {', '.join(map(str, choices))}")


def check_positive(values: dict[str, float | int | None], integer: bool = True) -> None:
    """Raise ``ConfigError`` for the first flag whose value is missing or not > 0 (>= 1 for integers)."""
    for flag, value in values.items():
        if integer and (value is None or value < 1):
            raise ConfigError(f"{flag} {value}: must be a positive integer")
        if not integer and not (value is not None and value > 0):
            raise ConfigError(f"{flag} {value}: must be > 0")
