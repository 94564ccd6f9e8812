"""One home per task family: agentrft/tasks/NAME/ holds its dataset builder, environment,
job(s), grader files, demo and README with results; runner.py is the one runner every demo uses."""
