"""Device side: what one simulated device does with one task (data, model, local training)."""
