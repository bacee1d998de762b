"""Server-side evaluation of each global model version and the run's result files."""
