"""Equivalence checks run by hand: the same bits across two checkouts (``same_bits``) and how far CUDA moves the
numbers from the CPU's (``gpu_equivalence``). The tests use their functions too."""
