"""Fake GPUs and a fake MPS daemon, only when asked for (`--fake-gpus`, tests): a fake NVML
library under the real NVML backend, driven by a spec and the files of a state folder."""
