"""The code_fix task: dataset builder, environment, job(s), demo and README with results."""
