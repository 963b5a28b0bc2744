"""What an admin runs on a machine: `gpuq admin install` (config, folders, the system user and
systemd units) and `gpuq admin doctor` (one line per check of what makes jobs fail or run
unisolated, each with how to fix it)."""
