"""The repo_research task: dataset builder, environment, job(s), demo and README with results."""
