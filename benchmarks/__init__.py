"""Benchmarks by purpose: ``perf`` (what a run costs), ``repro`` (the FedRevive paper's reproduction), ``peers``
(other frameworks on the same work), ``checks`` (same bits, GPU equivalence) and ``lib`` (what they and the tests
share). Every script runs as ``python benchmarks/perf/bench_engine.py`` or ``python -m benchmarks.perf.bench_engine``;
``gpu_checks.sh`` runs GPU_FIX_NOTES.md's checks in one GPU lease. Benchmarks may import any project package; no
project package imports them."""
