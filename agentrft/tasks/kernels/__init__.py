"""The kernels task: dataset builder, environment, job(s), demo and README with results."""
