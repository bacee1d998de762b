"""Server-side model managers: how device updates become the next global model."""
