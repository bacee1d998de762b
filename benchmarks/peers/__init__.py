"""Peer comparisons: our FedAvg job beside pfl-research and Flower on the same work (the ``peers`` extra)."""
