"""Datasets (CIFAR-10, synthetic, a user's .npz) and the per-device partition."""
