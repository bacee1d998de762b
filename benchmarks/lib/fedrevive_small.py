"""FedRevive's settings for small real runs, one source for the benchmarks and the tests (tests import it from
here; a benchmark never imports tests).

Both phases start early, distillation at version 2 and the distilled model's KD training at version 3, so a run
of a few versions goes through the generator's warm-up and revives stale updates; synthesis and distillation are
cut down (2 teachers of 2 images each per round, one KD iteration, a generator 8 channels wide, a pool of 32
images) so that a CPU runs a version in about a second. ``benchmarks/checks/same_bits.py`` digests such a run; the e2e
tests (``tests/e2e``) run FedRevive with it.
"""

from __future__ import annotations

FEDREVIVE_SMALL = (
    "--fr-distill-from-version 2 --fr-kd-train-from-version 3 --fr-s-max 2 --fr-teacher-buffer-size 2 "
    "--fr-synth-per-teacher 2 --fr-kd-iters 1 --fr-gen-width 8 --fr-synth-every-versions 1 --fr-synth-batch-size 8 "
    "--fr-pool-size 32 --fr-probe-samples 8"
).split()
