"""The node's GPUs as the agent sees them: the NVML backend and its inventory, health and
events, which job holds which unit, each job's GPU telemetry, and the hand-over of units
between jobs."""
