"""Command-line flags generated from a frozen config dataclass: one flag per field, its help from the class's
``Attributes:`` docstring section, its default from the field.

A config part documents each field once, in its docstring (``name: what it is``, continuation lines indented);
the flags, their help and their defaults follow from it, so a new field needs no parser change. Used for
FedRevive's ``--fr-*`` flags (and any method's own config part).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: its description}`` from the ``Attributes:`` section of ``cls``'s docstring, each on one line."""
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


def _flag_type(field: dataclasses.Field, hints: dict):
    hint = hints.get(field.name, type(field.default))
    for candidate in (int, float, str):
        if hint is candidate or candidate in typing.get_args(hint):
            return candidate
    return type(field.default)


def add_dataclass_flags(group, cls: type, prefix: str, dest_prefix: str) -> None:
    """One flag ``--<prefix><field-name>`` per field of ``cls`` (destination ``<dest_prefix><field>``), with the
    field's docstring description as help and its default (bool fields: ``--x`` / ``--no-x``)."""
    docs = attribute_docs(cls)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        flag = f"--{prefix}{field.name.replace('_', '-')}"
        help_text = docs.get(field.name, f"{cls.__name__}.{field.name}")
        if isinstance(field.default, bool):
            group.add_argument(
                flag,
                dest=f"{dest_prefix}{field.name}",
                action=argparse.BooleanOptionalAction,
                default=field.default,
                help=f"{help_text} (default: {'on' if field.default else 'off'})",
            )
            continue
        hint = hints.get(field.name)
        if typing.get_origin(hint) is typing.Literal:  # a choice: argparse names the others on a wrong one
            group.add_argument(
                flag,
                dest=f"{dest_prefix}{field.name}",
                choices=typing.get_args(hint),
                default=field.default,
                help=help_text,
            )
            continue
        group.add_argument(
            flag,
            dest=f"{dest_prefix}{field.name}",
            type=_flag_type(field, hints),
            default=field.default,
            metavar=field.name.upper(),
            help=help_text,
        )
