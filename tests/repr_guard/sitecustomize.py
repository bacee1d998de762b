"""Loaded by every Python process of a guarded test run (through ``PYTHONPATH``): records any attempt to render a
large numpy array as text.

NVFlare evaluates some debug f-strings even with debug logging off; one that renders a model or a diff costs
milliseconds per device. Numpy's C ``repr``/``str`` of an array call ``numpy._core.arrayprint._default_array_repr``
/ ``_default_array_str``, looked up when first needed, so replacing them here (before any array is printed)
reaches every f-string and log call in the process. Each offending call appends its stack to the file named by
``EDGESIM_REPR_GUARD``; rendering still works, so the run itself is not disturbed.
"""

import os
import traceback

GUARD_FILE = os.environ.get("EDGESIM_REPR_GUARD")
LARGE = 1000  # elements; a model layer or diff, never a small status array

if GUARD_FILE:
    from numpy._core import arrayprint

    def _guarded(render):
        def wrapper(a, *args, **kwargs):
            if getattr(a, "size", 0) > LARGE:
                with open(GUARD_FILE, "a") as f:
                    f.write(f"pid {os.getpid()}: rendered an array of {a.size} elements\n")
                    f.write("".join(traceback.format_stack(limit=12)) + "\n")
            return render(a, *args, **kwargs)

        return wrapper

    arrayprint._default_array_repr = _guarded(arrayprint._default_array_repr)
    arrayprint._default_array_str = _guarded(arrayprint._default_array_str)
