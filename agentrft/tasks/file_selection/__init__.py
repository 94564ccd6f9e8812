"""The file_selection task: dataset builder, environment, job(s), demo and README with results."""
