"""The jobs on the node: what a supervisor runs (launch specs, job accounts, isolation, MPS
shares), the supervisors themselves (the fork server, job folders, their reports, stopping an
orphaned job), which job a process belongs to, and interactive jobs' terminals."""
