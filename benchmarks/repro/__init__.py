"""The FedRevive paper's reproduction: R2's table and the grid that reproduces it, the estimate of a paper seed's
time from slices, the precision curves, and the calibration of the generated data that stands in for CIFAR-10."""
