"""How every change to jobs happens: decided once as Effects (transitions), written in one
store transaction (the StoreWriter's group commit), applied to memory and told to agents and
listeners (JobChanges, the one applier; the EventBus and its Watchers)."""
