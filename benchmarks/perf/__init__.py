"""Performance benches: what a part of a run costs (the engines, the protocol, NVFlare's wire, the fixed cost of a
run, checkpoints, DP, ...), each a script that prints its figures and ratios from one run."""
