"""Device-simulation engine that runs on each leaf client: planner, clock, simulator, runner, monitor."""
