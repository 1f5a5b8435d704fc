"""Node backends: where GPU facts come from (NVML on real nodes, the simulator elsewhere)."""
