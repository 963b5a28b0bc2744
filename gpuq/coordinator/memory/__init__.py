"""The coordinator's memory: live jobs, nodes and what the pure scheduler needs beyond them, as
the store last committed them (the store is the truth; memory is the cache reads use)."""
