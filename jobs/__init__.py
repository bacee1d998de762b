"""What a user runs: the job entry points and the shared config, recipe, environment and results code."""
