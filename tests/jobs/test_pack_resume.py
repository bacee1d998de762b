"""``--resume`` of a pack's folder (``jobs.run.pack_folder``): the manifest a pack writes, and every refusal in one
line naming the fix, exit code 2, before any process starts. A pack stopped and resumed runs end to end in
``tests/e2e/test_pack_resume.py``."""

from __future__ import annotations

import json

import pytest

from common.choices import ConfigError
from common.result_files import METRICS, PACK_MANIFEST
from jobs.run.pack_folder import read_manifest, write_manifest
from tests.jobs.test_seeds import SMALL, refused

pytestmark = pytest.mark.usefixtures("no_pack_starts")


def pack_folder(tmp_path, kind: str, runs: dict[str, str]):
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / PACK_MANIFEST).write_text(json.dumps({"kind": kind, "runs": runs}))
    return folder


def test_a_pack_writes_its_runs_into_their_folder_and_nothing_where_that_holds_more_or_they_have_none(tmp_path):
    for folder in ("out/seed-0", "out/seed-1", "x/a", "y/b"):  # as the pack makes them before it writes its manifest
        (tmp_path / folder).mkdir(parents=True)
    write_manifest("seeds", ["0", "1"], [str(tmp_path / "out" / "seed-0"), str(tmp_path / "out" / "seed-1")])
    manifest = read_manifest(str(tmp_path / "out"))
    assert (manifest.kind, manifest.runs, manifest.at_once) == ("seeds", {"0": "seed-0", "1": "seed-1"}, 0)
    write_manifest("seeds", ["0", "1"], [str(tmp_path / "out" / "seed-0"), str(tmp_path / "out" / "seed-1")], 1)
    assert read_manifest(str(tmp_path / "out")).at_once == 1  # --runs-at-once: a resume keeps it
    write_manifest("runs", ["a", "b"], [str(tmp_path / "x" / "a"), str(tmp_path / "y" / "b")])
    assert not (tmp_path / "x" / PACK_MANIFEST).exists() and not (tmp_path / PACK_MANIFEST).exists()
    (tmp_path / "x" / "b").mkdir()
    (tmp_path / "x" / "0000.log").write_text("")  # a sweep's trials folder: other trials' files beside the pack
    write_manifest("runs", ["a", "b"], [str(tmp_path / "x" / "a"), str(tmp_path / "x" / "b")])
    assert not (tmp_path / "x" / PACK_MANIFEST).exists()


def test_a_runs_own_folder_is_no_packs_and_a_broken_manifest_is_refused(tmp_path):
    folder = pack_folder(tmp_path, "seeds", {"0": "seed-0", "1": "seed-1"})
    (folder / METRICS).write_text("{}")  # a run's folder (a run's results beside a manifest): resumed as one run
    assert read_manifest(str(folder)) is None
    assert read_manifest(str(tmp_path / "nothing")) is None
    (folder / METRICS).unlink()
    (folder / PACK_MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read .*; resume each run alone"):
        read_manifest(str(folder))


def test_seeds_or_runs_with_a_folder_that_is_no_packs_are_refused_in_one_line(tmp_path, capsys):
    code, line = refused([*SMALL, "--seeds", "0,1", "--resume", str(tmp_path)], capsys)
    assert code == 2 and f"--resume {tmp_path}: not a pack's folder (no {PACK_MANIFEST} there)" in line, line


@pytest.mark.parametrize(
    "kind, runs, flags, says",
    [
        ("seeds", {"0": "seed-0", "1": "seed-1"}, ["--seeds", "0,2"], "the pack's runs are 0,1; leave out --seeds"),
        ("runs", {"a": "a", "b": "b"}, ["--seeds", "0,1"], "the pack's runs are a,b; leave out --seeds"),
        ("runs", {"a": "a", "b": "b"}, ["--runs", "runs.json"], "each run of the pack keeps its own flags"),
        ("seeds", {"0": "seed-0", "1": "seed-1"}, [], "seed 0: --resume"),  # its folder holds no results
    ],
)
def test_a_refused_resume_of_a_pack_exits_2_in_one_line(kind, runs, flags, says, tmp_path, capsys):
    folder = pack_folder(tmp_path, kind, runs)
    code, line = refused(["--resume", str(folder), *flags], capsys)
    assert code == 2 and line.startswith("error: ") and says in line, line


@pytest.mark.parametrize("extra", [{"seeds": [0, 1]}, {"runs": {"a": {}, "b": {}}}])
def test_the_api_refuses_resume_of_a_pack_with_seeds_or_runs(extra, tmp_path):
    from jobs.api import run

    folder = pack_folder(tmp_path, "seeds", {"0": "seed-0", "1": "seed-1"})
    with pytest.raises(ConfigError, match="resume= of a pack's folder with seeds=, runs= or a JobConfig"):
        run("fedbuff", resume=str(folder), **extra)
