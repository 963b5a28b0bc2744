"""The scheduler: a pure function of (cluster snapshot, pending jobs, policy, now) returning
decisions (start, preempt, cancel, and the reasons every other job waits). It does no I/O and
imports nothing of gpuq but gpuq.domain, gpuq.scheduler and gpuq.errors; the coordinator
builds the snapshot and applies the decisions.

The modules: snapshot (what goes in and comes out), plan (one pass), fitting (does a job fit
on a node, and why not), gang (jobs of several nodes, or of whole nodes), reserve (backfill
reservations and estimated starts), preempt (victims), priority (multifactor), eligibility
(dependencies, begin times, QOS limits), array_split (how many array tasks to split off before
a pass). This package re-exports nothing.
"""
