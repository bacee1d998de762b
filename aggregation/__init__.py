"""How device updates travel and combine: the leaves' executor and updater, the server's global model and the
methods' strategies that make its next version."""
