"""Command-line flags generated from a frozen config dataclass: one flag per field, its help from the class's
``Attributes:`` docstring section, its default from the field and its choices from the field's ``Literal``.

A config part documents each field once, in its docstring (``name: what it is``, continuation lines indented);
the flags, their help and their defaults follow from it, so a new field needs no parser change. The flags appear
in the docstring's order. A field whose default is ``None`` (computed later: planned, derived) says what happens
in a trailing ``(default: WORDS)`` of its entry, and ``--help`` shows those words. Every job flag is made here
(``jobs/cli.py`` names the few exceptions); so are a method's own flags (FedRevive's ``--fr-*``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_DEFAULT_WORDS = re.compile(r"\s*\(default: (.*)\)\.?$")


@dataclass(frozen=True)
class Flag:
    """How one field's flag differs from the generated ``--<prefix><field-name>``.

    Attributes:
        name: the flag's name instead (with ``action``: e.g. ``--no-device-reuse``).
        action: ``store_true`` or ``store_false`` for a one-way switch (default for a bool field: ``--x`` /
            ``--no-x``).
        metavar: the value's placeholder in ``--help`` (default: the field's name in capitals).
        filled: the parser's default is ``None`` ("not given") because something else fills the field (a method's
            preset, the delay preset); ``--help`` shows these words as its default ("": none shown).
        hidden: the field has no flag (an option of ``jobs.api`` only).
    """

    name: str = ""
    action: str = ""
    metavar: str = ""
    filled: str | None = None
    hidden: bool = False


Extra = tuple[Sequence[str], dict]
"""A flag without a field of its own: ``(option strings, add_argument keywords)``."""


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: its description}`` from the ``Attributes:`` section of ``cls``'s docstring, each on one line, in
    the docstring's order."""
    doc = cls.__doc__ or ""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    docs: dict[str, str] = {}
    name = None
    entry = re.compile(r"^\s*(\w+):\s*(.*)$")
    indent = None
    for line in lines[start + 1 :]:
        if not line.strip():
            if docs:
                name = None
            continue
        width = len(line) - len(line.lstrip())
        found = entry.match(line)
        if found and (indent is None or width <= indent):
            indent = width
            name = found.group(1)
            docs[name] = found.group(2).strip()
        elif name is not None and indent is not None and width > indent:
            docs[name] = f"{docs[name]} {line.strip()}"
        else:
            break
    return docs


def show(value: object) -> str:
    """A default as ``--help`` writes it (``on`` / ``off`` for a switch, ``""`` for none)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == "" or value == ():
        return ""
    return str(value)


def split_default(text: str) -> tuple[str, str | None]:
    """A docstring entry as (its description as plain text, the words of its trailing ``(default: ...)`` or
    None): reST literal markers and a final full stop dropped."""
    text = text.replace("``", "")
    found = _DEFAULT_WORDS.search(text)
    if found:
        return text[: found.start()], found.group(1)
    return text.rstrip("."), None


def default_words(cls: type, name: str) -> str:
    """What ``--help`` says the default of ``cls``'s field ``name`` is: its docstring's words, or its value."""
    words = split_default(attribute_docs(cls).get(name, ""))[1]
    if words is not None:
        return words
    return show(next(f.default for f in dataclasses.fields(cls) if f.name == name))


def float_list(text: str) -> tuple[float, ...]:
    """A comma-separated list of numbers (``1,1.3,1.6``); empty: none."""
    return tuple(float(v) for v in text.split(",") if v.strip()) if text else ()


def _flag_type(field: dataclasses.Field, hints: dict):
    hint = hints.get(field.name, type(field.default))
    if typing.get_origin(hint) is tuple:
        return float_list
    if str in typing.get_args(hint) and float in typing.get_args(hint):
        return str  # a number or a text (a bandwidth or its distribution): the config part parses it
    for candidate in (int, float, str):
        if hint is candidate or candidate in typing.get_args(hint):
            return candidate
    return type(field.default)


def _ordered(cls: type, docs: dict[str, str]) -> list[dataclasses.Field]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return [fields[n] for n in docs if n in fields] + [f for n, f in fields.items() if n not in docs]


def add_dataclass_flags(
    group,
    cls: type,
    prefix: str = "",
    dest_prefix: str = "",
    flags: Mapping[str, Flag] | None = None,
    extras: Mapping[str, Sequence[Extra]] | None = None,
) -> None:
    """One flag ``--<prefix><field-name>`` per field of ``cls`` (destination ``<dest_prefix><field>``), help from
    the field's docstring entry followed by its default, choices from its ``Literal`` (bool fields: ``--x`` /
    ``--no-x``). ``flags``: the fields whose flag differs (``Flag``). ``extras``: flags with no field of their
    own, added after the field named by their key ("": before the first)."""
    flags = flags or {}
    extras = extras or {}
    docs = attribute_docs(cls)
    hints = typing.get_type_hints(cls)
    for option_strings, kwargs in extras.get("", ()):
        group.add_argument(*option_strings, **kwargs)
    for field in _ordered(cls, docs):
        spec = flags.get(field.name, Flag())
        if not spec.hidden:
            _add_flag(group, cls, field, hints, docs, spec, prefix, dest_prefix)
        for option_strings, kwargs in extras.get(field.name, ()):
            group.add_argument(*option_strings, **kwargs)


def _add_flag(group, cls, field, hints, docs, spec: Flag, prefix: str, dest_prefix: str) -> None:
    text, words = split_default(docs.get(field.name, f"{cls.__name__}.{field.name}"))
    default = None if spec.filled is not None else field.default
    if spec.filled is not None:
        words = spec.filled
    elif words is None:
        words = show(field.default)
    help_text = (f"{text} (default: {words})" if words else text).replace("%", "%%")  # argparse formats help
    kwargs: dict = {"dest": f"{dest_prefix}{field.name}", "help": help_text}
    flag = spec.name or f"--{prefix}{field.name.replace('_', '-')}"
    hint = hints.get(field.name)
    if spec.action:
        kwargs["action"] = spec.action
    elif isinstance(field.default, bool):
        kwargs |= {"action": argparse.BooleanOptionalAction, "default": default}
    elif typing.get_origin(hint) is typing.Literal:  # a choice: argparse names the others on a wrong one
        kwargs |= {"choices": typing.get_args(hint), "default": default}
    else:
        kwargs |= {"type": _flag_type(field, hints), "default": default}
        kwargs["metavar"] = spec.metavar or field.name.upper()
    group.add_argument(flag, **kwargs)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The destinations of the flags written on the command line (not their defaults)."""
    given = set()
    for action in parser._actions:  # argparse has no public list of its actions
        for option in action.option_strings:
            if any(arg == option or arg.startswith(option + "=") for arg in argv):
                given.add(action.dest)
    return given


def flag_args(flags: dict) -> list[str]:
    """Flags as command-line words: ``True`` an on switch, ``False`` its ``--no-`` form, a list comma-joined."""
    words = []
    for name, value in flags.items():
        if value is True:
            words.append(f"--{name}")
        elif value is False:
            words.append(f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            words += [f"--{name}", ",".join(str(v) for v in value)]
        else:  # repr of a float is the shortest text that reads back as the same float: the command is exact
            words += [f"--{name}", repr(value) if isinstance(value, float) else str(value)]
    return words
