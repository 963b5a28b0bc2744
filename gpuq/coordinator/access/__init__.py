"""Who calls and what they may do: the Authority (credentials, the handshake socket), the named
permission checks, and per-user tokens."""
