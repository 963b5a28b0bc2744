"""The job aggregate: submissions, users' actions over a selection, where jobs end, array tasks,
running jobs' samples (idle rules, GPU telemetry), and the rules of `gpuq update`."""
