"""Scheduling passes: the loop that runs one at a time, and a pass (snapshot from memory, the
pure plan of gpuq.scheduler, its decisions committed as effects, why jobs wait)."""
