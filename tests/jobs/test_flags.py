"""Every job flag comes from one source: the config field that owns it. ``--help`` states each field's own default,
every field has its flag (or is named as having none), and the README's short flag table matches the parser."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

import pytest

from common.config_flags import attribute_docs, show
from common.delays import DELAY_PRESETS
from jobs.build import checked_config
from jobs.cli import DEFAULT_METHOD, FLAGS, PRESET_FIELDS, build_parser, config_from_args
from jobs.config import PARTS
from jobs.engine_config import EngineConfig
from jobs.methods import BUILT_IN
from processors.model_names import PRESET_FIELDS as MODEL_PRESET_FIELDS
from simulation.planner import CPU_GROUP_MAX_MFLOPS
from tests.conftest import REPO

DEFAULT = re.compile(r"\(default: (.*)\)$")


def wide_help(parser: argparse.ArgumentParser) -> str:
    """``--help`` with each flag's help on one line (no wrapping inside a default such as a hyphenated path)."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "3000"  # argparse's width, read when it formats
    try:
        return parser.format_help()
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def flag_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag's ``--help`` text on one line, by its first long option."""
    helps, flag = {}, None
    for line in wide_help(parser).splitlines():
        stripped = line.strip()
        if line.startswith("  -") and stripped.startswith("-"):
            flag = [s.strip(",") for s in stripped.split() if s.startswith("--")][0]
            helps[flag] = " ".join(stripped.split()[2:])
        elif flag and line.startswith(" " * 10):
            helps[flag] += " " + stripped
        else:
            flag = None
    return {f: h.strip() for f, h in helps.items()}


def help_defaults(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    """Each flag's default as the ``--help`` text states it (None: it states none), by its first long option."""
    return {f: (m.group(1) if (m := DEFAULT.search(h)) else None) for f, h in flag_helps(parser).items()}


def field_actions(parser: argparse.ArgumentParser):
    """(flag, action, config class, field) of every flag that sets one config field (a part's or a method's)."""
    owners = {f.name: (cls, f) for cls in PARTS.values() for f in dataclasses.fields(cls)}
    for method in BUILT_IN.values():
        if method.settings is not None:
            owners |= {
                f"{method.flag_prefix}_{f.name}": (method.settings, f) for f in dataclasses.fields(method.settings)
            }
    for action in parser._actions:  # argparse has no public list of its actions
        if action.dest in owners and not isinstance(action, argparse._StoreConstAction):  # --real-delays: a shortcut
            yield next(o for o in action.option_strings if o.startswith("--")), action, *owners[action.dest]


def default_mismatches(parser: argparse.ArgumentParser) -> list[tuple]:
    """The flags whose parser default or ``--help``-stated default is not their config field's default."""
    stated = help_defaults(parser)
    wrong = []
    for flag, action, _cls, field in field_actions(parser):
        words = stated[flag] or ""
        if action.default is None and field.default is not None:  # filled when not given: a preset's value
            if field.name in PRESET_FIELDS or field.name in MODEL_PRESET_FIELDS:  # a method's or a model's
                ok = words.split(",")[0] == show(field.default)
            else:  # a delay field: the --delays preset's value, the same in every preset or not
                values = {repr(getattr(p, field.name)) for p in DELAY_PRESETS.values()}
                ok = words == (show(field.default) if len(values) == 1 else "the --delays preset's")
        elif field.default is None:  # computed later: the help says how, in words
            ok = action.default is None and words != "None"
        else:  # an empty default ("") may say in words what it becomes (--job-name: edgesim_<method>)
            said = words == show(field.default) or (show(field.default) == "" and words != "None")
            ok = action.default == field.default and said
        if not ok:
            wrong.append((flag, action.default, words, field.default))
    return wrong


@pytest.mark.parametrize("method_choice", [False, True], ids=["pt_job_fedavg", "pt_job_fedrevive"])
def test_help_states_each_fields_own_default(method_choice):
    parser = build_parser("test", method_choice=method_choice)
    assert len(list(field_actions(parser))) >= 59 + 26 * method_choice  # every field flag is checked
    assert default_mismatches(parser) == []


def test_a_default_written_apart_from_its_field_fails_the_check():
    parser = build_parser("test")
    action = next(a for a in parser._actions if a.dest == "local_iters")
    action.help = action.help.replace("(default: 25)", "(default: 24)")
    assert [m[0] for m in default_mismatches(parser)] == ["--local-iters"]
    parser = build_parser("test")
    next(a for a in parser._actions if a.dest == "synthetic_size").default = 100
    assert [m[0] for m in default_mismatches(parser)] == ["--synthetic-size"]


def test_every_field_has_a_flag_or_is_named_as_having_none():
    parser = build_parser("test", method_choice=True)
    dests = {a.dest for a in parser._actions}
    hidden = {name for part in FLAGS.values() for name, flag in part.items() if flag.hidden}
    for part, cls in PARTS.items():
        for field in dataclasses.fields(cls):
            assert (field.name in dests) != (field.name in hidden), (part, field.name)
            assert field.name in attribute_docs(cls), f"{cls.__name__}.{field.name} has no Attributes: entry"


def test_the_help_has_no_reST_markers_nor_python_words():
    out = wide_help(build_parser("test", method_choice=True))
    assert "``" not in out and "(default: None)" not in out and "(default: )" not in out
    assert out.count("--delays preset's") == 7  # the delay fields a preset sets; the others state their value


def test_the_engine_help_states_the_planners_cpu_rule():
    rule = f"on the CPU, costs over {CPU_GROUP_MAX_MFLOPS:g} MFLOP per training sample"
    assert rule in attribute_docs(EngineConfig)["engine"]
    assert rule in wide_help(build_parser("test"))


def readme_flags() -> list[tuple[str, str]]:
    """(flag, stated default) of each row of the README's "Main flags" table."""
    text = open(os.path.join(REPO, "README.md")).read()
    section = text.split("## Main flags", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[0].replace(" ", "") == "|flag|default|whatitsets|" and set(rows[1]) <= set("|- "), rows[:2]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]
    return [(flag.strip("`"), default.replace("`", "")) for flag, default, _ in cells]


def test_the_readme_table_is_one_table_of_about_ten_flags_the_parser_has_with_its_defaults():
    text = open(os.path.join(REPO, "README.md")).read()
    section = text.split("## Main flags", 1)[1].split("\n## ", 1)[0]
    table = [i for i, line in enumerate(section.splitlines()) if line.startswith("|")]
    assert table == list(range(table[0], table[-1] + 1)), "a blank line splits the table"
    rows = readme_flags()
    assert 8 <= len(rows) <= 12
    stated = help_defaults(build_parser("test", method_choice=True))
    for flag, default in rows:
        assert flag in stated, f"README names {flag}, which the parser lacks"
        assert default == (stated[flag] or ""), (flag, default, stated[flag])
    assert dict(rows)["--method"] == DEFAULT_METHOD


def test_the_delays_help_describes_each_preset_from_its_config():
    delays = flag_helps(build_parser("test"))["--delays"]
    for name, preset in DELAY_PRESETS.items():
        assert re.search(rf"(: |; ){name}( \([^)]*\))?: {re.escape(preset.summary())}(;|$| \(default)", delays), name
    assert "exponential speeds 1/1.3/1.6 (p 0.25/0.5/0.25), download 0.1, upload 0.15 or 0.25 +-0.02" in delays


@pytest.mark.parametrize("method", list(BUILT_IN))
def test_no_flag_given_builds_the_config_of_no_option_given(method, tmp_path):
    """The parser's defaults add nothing: each field keeps its own default, or the preset's."""
    for presets in (False, True):
        for delays in ([], ["--delays", "paper"]):  # a delay flag's default must not undo the preset's value
            argv = ["--output", str(tmp_path), *delays] + (["--method", method] if presets else [])
            args = build_parser("test", method_choice=presets).parse_args(argv)
            options = {"output": str(tmp_path)} | ({"delays": "paper"} if delays else {})
            assert config_from_args(args, method, presets) == checked_config(method, options, presets=presets)


def test_each_flag_is_the_option_of_its_name_with_underscores(tmp_path):
    argv = "--delays paper --speed-probs 0.2,0.3,0.5 --availability diurnal --availability-period 10 --no-device-reuse"
    argv += " --global-lr 0.5 --fr-s-max 10 --fr-warmup-blend pass --dry-run --eval-backlog wait --num-workers 3"
    args = build_parser("test", method_choice=True).parse_args([*argv.split(), "--output", str(tmp_path)])
    options = {
        "delays": "paper",
        "speed_probs": (0.2, 0.3, 0.5),
        "availability": "diurnal",
        "availability_period": 10.0,
        "device_reuse": False,
        "global_lr": 0.5,
        "fr_s_max": 10.0,
        "fr_warmup_blend": "pass",
        "dry_run": True,
        "eval_backlog": "wait",
        "num_workers": 3,
        "output": str(tmp_path),
    }
    assert config_from_args(args, "fedrevive", presets=True) == checked_config("fedrevive", options, presets=True)
