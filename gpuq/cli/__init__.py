"""The `gpuq` command line: one module per group of verbs (gpuq.cli.verbs names each verb's),
the click group, its errors and exit codes (gpuq.cli.group), what listings look like
(gpuq.cli.render), and the fast path that serves a call from a warm helper (gpuq.cli.fast)."""
