"""The node simulator: GPUs with NVML's MIG semantics and workloads that look like real fleets.

- `spec`: loading and checking sim specs (JSON), built-in scenarios in `scenarios/`;
- `workloads`: the workload models (idle, inference, training, notebook, steady);
- `device`: a simulated GPU with its MIG state machine;
- `gpuops.node.backends.sim.SimBackend`: the backend that puts them together.
"""

from __future__ import annotations
