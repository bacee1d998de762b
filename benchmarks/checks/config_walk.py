"""Config walk: how straight the path from options to a resolved run config is (issue 58's first goal).

    python benchmarks/checks/config_walk.py            # the count, then the modules in the order first entered
    python benchmarks/checks/config_walk.py --json     # the same as JSON (``tests/jobs/test_build.py``)
    python benchmarks/checks/config_walk.py --pairs    # and the returns by the move that made them (A -> B)

In this process, once the project's modules are imported, one ``jobs.api.make_config`` call builds a FedBuff
config with central differential privacy, seeded noise and a target epsilon: every stage of the build runs
(presets, the ``auto`` model, the parts, the cross-checks, the planned compositions, the noise and its key).
``sys.setprofile`` follows the calls and returns of the project's own functions (files in this checkout, outside
a virtual environment), leaving aside code that imports run (a ``<module>`` frame and what it calls); each
function is followed on its first call only, as a reader reads it once (a loop's repeats add nothing). After each
call or return control is in one module (a return: the calling project frame's); a *return to a module* is
control coming back to a module it had left earlier in the walk (A -> B -> A counts one: a stage that calls a
helper elsewhere and goes on counts once per helper). Each is a place a reader follows the value back up.

The rule is the issue's words taken literally: a callee's return into its caller is control coming back to a
module it had left, and so is a call into a module entered before; a function already followed adds nothing.
Measured with this rule at the commit the issue was filed against (``2148721``) it gives 134 returns across 34
modules, not the issue's 97 across 24 (counting only returns gives 83, only calls 51): the issue counted otherwise,
so this script's own count at each commit is the measure (``tests/jobs/test_build.py``'s ``WALK_CEILING``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

OPTIONS = {
    "dp": "central",
    "dp_noise": "seeded",
    "dp_target_epsilon": 8.0,
    "dp_clip_norm": 0.05,
    "num_leaf_nodes": 2,
    "devices_per_leaf": 6,
    "device_selection_size": 8,
    "synthetic_size": 3000,
    "max_model_version": 6,
    "seed": 7,
}
"""The walked build's options: ``make_config("fedbuff", **OPTIONS, output=...)``."""


def project_module(filename: str) -> str | None:
    """The dotted module of a file of this checkout (``jobs/api.py`` -> ``jobs.api``), None for any other file."""
    if not os.path.isabs(filename):
        return None  # generated code (a dataclass's ``__init__``: ``<string>``) or a frozen module
    path = os.path.normpath(filename)
    if not path.startswith(REPO + os.sep) or os.sep + "." in path[len(REPO) :]:
        return None  # outside the checkout, or in a hidden folder (a virtual environment)
    rel = os.path.splitext(os.path.relpath(path, REPO))[0]
    return rel.replace(os.sep, ".").removesuffix(".__init__")


class Walk:
    """A ``sys.setprofile`` hook: the sequence of project modules control is in, imports left aside, each function
    followed on its first call only (its later calls, a loop's, add no new place to read)."""

    def __init__(self) -> None:
        self.modules: list[str] = []  # control's module after each move, consecutive repeats collapsed
        self._importing = 0  # depth inside import-time code (``<module>`` frames)
        self._repeat = 0  # depth inside a call of a function already followed
        self._followed: set = set()
        self._files: dict[str, str | None] = {}

    def _module(self, frame) -> str | None:
        name = frame.f_code.co_filename
        if name not in self._files:
            self._files[name] = project_module(name)
        return self._files[name]

    def _caller(self, frame) -> str | None:
        """The project module a return goes back to (the nearest project frame up the stack)."""
        frame = frame.f_back
        while frame is not None and self._module(frame) is None:
            frame = frame.f_back
        return self._module(frame) if frame is not None else None

    def __call__(self, frame, event: str, arg) -> None:
        if event not in ("call", "return"):
            return
        if frame.f_code.co_name == "<module>":
            self._importing += 1 if event == "call" else -1
            return
        module = self._module(frame)
        if self._importing or module is None:
            return
        if event == "call":
            if self._repeat or frame.f_code in self._followed:
                self._repeat += 1
                return
            self._followed.add(frame.f_code)
        elif self._repeat:
            self._repeat -= 1
            return
        where = module if event == "call" else self._caller(frame)
        if where is not None and (not self.modules or self.modules[-1] != where):
            self.modules.append(where)

    def returns(self) -> int:
        """Moves into a module control had left earlier in the walk."""
        return sum(self.pairs().values())

    def pairs(self) -> Counter:
        """The returns by move: (the module control left, the module it came back to) -> how many times."""
        seen: set[str] = set()
        found: Counter = Counter()
        for before, module in zip([None, *self.modules], self.modules, strict=False):
            if module in seen:
                found[(before, module)] += 1
            seen.add(module)
        return found


def walk() -> dict:
    """Build the config once under the profiler; the returns, the modules (in first-entered order) and each
    module's entries."""
    from jobs.api import make_config  # imported before the walk: import-time code is not the build's

    with tempfile.TemporaryDirectory() as tmp:
        hook = Walk()
        sys.setprofile(hook)
        try:
            make_config("fedbuff", output=os.path.join(tmp, "out"), **OPTIONS)
        finally:
            sys.setprofile(None)
    entries = Counter(hook.modules)
    return {
        "returns": hook.returns(),
        "modules": list(dict.fromkeys(hook.modules)),
        "entries": dict(entries),
        "pairs": [[a, b, n] for (a, b), n in hook.pairs().most_common()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--pairs", action="store_true", help="also print the returns by move, most first")
    args = parser.parse_args(argv)
    found = walk()
    if args.json:
        print(json.dumps(found))
        return 0
    print(f"returns to a module left earlier: {found['returns']}, across {len(found['modules'])} modules")
    for module in found["modules"]:
        print(f"  {found['entries'][module]:4d}  {module}")
    if args.pairs:
        print("returns by move (left -> came back to):")
        for left, back, n in found["pairs"]:
            print(f"  {n:4d}  {left} -> {back}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
