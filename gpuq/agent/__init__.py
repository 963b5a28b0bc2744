"""The node agent: one per GPU node, between the coordinator and the node's jobs.

agent.py keeps the stream to the coordinator; launcher.py orders a launch from the
coordinator's JobLaunch to a supervisor; the rooms below own the rest:

- gpu/: the node's GPUs (the NVML backend, inventory, health, events, who holds which unit,
  per-job GPU telemetry, the hand-over of units between jobs);
- jobs/: the jobs on the node (launch specs, supervisors and the fork server, job folders,
  process attribution, terminals, isolation, MPS daemons);
- fake/: fake GPUs (a fake NVML library and its files) and a fake MPS daemon, for tests and
  `--fake-gpus`;
- native/: the C fork server and supervisor (the extension module gpuq.agent._supervise).
"""
