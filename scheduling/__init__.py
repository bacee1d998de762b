"""Server-side scheduling: which device trains which model version, and when its update is applied, on exact
simulated time (``ExactTimeAssessor``)."""
