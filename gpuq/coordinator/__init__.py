"""The coordinator: accepts work, schedules it over node agents, and keeps jobs, nodes and the
store in step. `server.assemble` puts it together (docs/ARCHITECTURE.md has the map); its rooms:
memory/ (what the store last committed), changes/ (how a change is decided, written, applied
and told), workload/ (the job aggregate's verbs and rules), scheduling/ (passes), nodes/ (agents
and their streams), access/ (who calls and what they may do) and front/ (the one door for
gRPC and the dashboard)."""
