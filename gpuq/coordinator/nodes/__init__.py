"""Nodes and their agents: the agent stream's messages (AgentLink), what agents are told
(AgentCommands, one AgentSession per stream), what agents send bounded at the edge, and
admins' drains and the heartbeat timeout (NodeAdmin)."""
