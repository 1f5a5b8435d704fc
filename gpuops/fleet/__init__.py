"""The operator side of the agent protocol: sessions to node agents (local, SSH)."""
