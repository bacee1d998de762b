"""Whether the installed NVFlare is the one our fixes to it were written against (the ``nvflare_private``
modules, one per process they patch).

Our fixes reach into NVFlare's private code: a few copy a function's body with one change, others rely on what a
function of NVFlare's does (where it sleeps, which branch a setting takes). An NVFlare upgrade that changes such a
function would not break a run: it would silently drop NVFlare's change inside our copy, or move a sleep out of
our cap. So each such function's source, as the tested NVFlare ships it, has a digest in its ``nvflare_private``
(``NVFLARE_COPIES``, ``NVFLARE_RELIED_ON``, merged here over ``PRIVATE_MODULES``), and here the installed source
is read again and compared:

* ``tests/simulation/test_nvflare_guard.py`` fails, naming each function whose installed source differs;
* a job's driver calls ``nvflare_problem`` before anything starts: the tested version says nothing; another
  version whose sources all still match is a warning (one line, both versions); another version where a source
  differs is a refusal (exit 2) naming the functions, unless ``ALLOW_ENV`` is set, because a run could then be
  silently wrong, and a wrong result is worse than none. The line names the fix: install the tested NVFlare, or
  review the fixes and set the variable;
* every NVFlare process that installs the fixes logs a warning once when the version differs
  (``common.nvflare_private.install_nvflare_fixes``): a deployment's sites may run another NVFlare than the machine that
  submits.

The source is read from NVFlare's module file (its ``ast``), not from the live function, so a fix already
installed in this process (which replaces some of these functions) does not hide NVFlare's own text.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType

import common.nvflare_private
import jobs.nvflare_private
import scheduling.nvflare_private
import simulation.nvflare_private
from common.nvflare_private import TESTED_NVFLARE

# every module holding private NVFlare names: one per process it patches (``docs/nvflare-upstream.md``)
PRIVATE_MODULES: tuple[ModuleType, ...] = (
    common.nvflare_private,
    simulation.nvflare_private,
    scheduling.nvflare_private,
    jobs.nvflare_private,
)


def merged(table: str) -> dict:
    """One of the modules' tables (``NVFLARE_COPIES``, ``NVFLARE_PRIVATE_ATTRIBUTES``, ...), over all of them."""
    found: dict = {}
    for module in PRIVATE_MODULES:
        found |= getattr(module, table, {})
    return found


NVFLARE_COPIES = merged("NVFLARE_COPIES")
NVFLARE_RELIED_ON = merged("NVFLARE_RELIED_ON")

ALLOW_ENV = "EDGESIM_ALLOW_UNTESTED_NVFLARE"  # set to 1: run on an NVFlare whose changed sources were reviewed
DIGEST_CHARS = 16


def installed_nvflare() -> str:
    """The installed NVFlare's version."""
    return importlib.metadata.version("nvflare")


def installed_source(path: str) -> str:
    """The source of ``path`` (``module.Class.function`` or ``module.function``) as the installed module file has
    it; "" when the module, class or function is gone."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
        module = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as f:
                text = f.read()
            return _member_source(text, parts[cut:])
    return ""


def _member_source(text: str, names: list[str]) -> str:
    """The source segment of the nested definition ``names`` (class, then function) in a module's ``text``."""
    body = ast.parse(text).body
    node = None
    for name in names:
        node = next((n for n in body if isinstance(n, _DEFS) and n.name == name), None)
        if node is None:
            return ""
        body = node.body
    return ast.get_source_segment(text, node) or ""


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def source_digest(source: str) -> str:
    """A digest of a function's source, blind to trailing whitespace only."""
    lines = "\n".join(line.rstrip() for line in source.strip("\n").splitlines())
    return hashlib.sha256(lines.encode()).hexdigest()[:DIGEST_CHARS]


def changed_sources(read: Callable[[str], str] | None = None) -> list[str]:
    """Each function of ``NVFLARE_COPIES`` and ``NVFLARE_RELIED_ON`` whose installed source (``read``, by default
    ``installed_source``) differs from the one our fix was written against, as ``path (what we do with it)``."""
    read = read or installed_source
    changed = []
    for table, role in ((NVFLARE_COPIES, "copied into ours"), (NVFLARE_RELIED_ON, "relied on by a fix")):
        for path, digest in table.items():
            source = read(path)
            if not source:
                changed.append(f"{path} (gone; {role})")
            elif source_digest(source) != digest:
                changed.append(f"{path} ({role})")
    return sorted(changed)


def nvflare_problem(version: str | None = None, read: Callable[[str], str] | None = None) -> tuple[str, bool]:
    """(one line to print, whether the run must stop); ("", False) on the tested NVFlare."""
    version = version or installed_nvflare()
    if version == TESTED_NVFLARE:
        return "", False
    head = f"NVFlare {version} is installed; edgesim-flare is tested with NVFlare {TESTED_NVFLARE}"
    changed = changed_sources(read)
    if not changed:
        return (
            f"warning: {head}. The NVFlare code our fixes copy or rely on is unchanged "
            "(the nvflare_private.py modules), but other behaviour may differ.",
            False,
        )
    if os.environ.get(ALLOW_ENV) == "1":
        return f"warning: {head}, and these changed: {', '.join(changed)}; running anyway ({ALLOW_ENV}=1).", False
    return (
        f"{head}, and the NVFlare code our fixes copy or rely on changed: {', '.join(changed)}; a run could be "
        f"silently wrong: pip install nvflare=={TESTED_NVFLARE}, or review each nvflare_private.py against "
        f"it and set {ALLOW_ENV}=1",
        True,
    )
