"""The TUI's screens: one per view (gpus, nodes, tenants, events), the node/GPU detail and help."""
