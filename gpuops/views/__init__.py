"""View models: what every screen and CLI table shows, computed from a fleet snapshot; pure
functions, no I/O (the two screen models below excepted), no widgets.

The TUI's widgets only draw what these functions return, so every figure can be tested without a
terminal and the CLI can reuse them. One module per screen family: `cells` and `grid` (the
fleet grid), `nodes` (node rows and the CLI's per-node summary), `tenants` and `tenant_history`,
`teams` (the CLI's per-team table), `events`, `status` (the status line), `detail` (node and GPU
detail), `filter` (the `/` filter), `format` (numbers with units), `common` (what they share).
Two screen models drive them: `feed` turns a fleet source's snapshots (`gpuops.fleet.source`)
into the immutable `FleetState` every live screen draws, and `pool` is the Pool screen's (a pool
change from evidence to applied, through tenancy/ and plan/: the one view model that reads nodes
and writes fleet.yaml, step by step in the screen's workers).

Definitions (also in docs/tui.md):

- **owner**: the team a GPU belongs to (fleet.yaml's per-GPU owner, else the node's owner, else the
  owner the node itself reports).
- **tenant** of a process: what the attribution chain says (`gpuops.tenancy`, docs/tenancy.md):
  by default the limiter region's tenant label, else the team of its unix user, else of one of
  its unix groups in fleet.yaml, else the GPU's owner (source ``owner``); a process nobody claims
  is unattributed: tenant ``-``, source ``none`` (shown and counted, never dropped).
- **GPU-equivalents**: a whole GPU counts 1; a MIG GPU instance counts its compute slices over the
  GPU's (a 3g slice of an H100 is 3/7).
- **busy**: capacity doing work, one meaning on every line (`common.capacity_state`): at least 5%
  utilized; a MIG slice by its SMs (GPM) where reported, else while it holds a process; counted
  in GPU-equivalents. **idle**: capacity with data that is not busy, free MIG slices included;
  **held idle**: the idle part holding processes or memory.
- **GPU-time**: utilization-weighted GPU-equivalents (a GPU at 50% is 0.5). A MIG slice holding a
  process counts its share times its SMs' utilization where NVML's GPM gives it (Hopper and
  newer), else all of its share (Ampere reports none per slice); node history
  (core/history.py `gpu_shares`) and the PromQL history rules count it alike. A GPU's time is
  split between the tenants on it by the memory their processes hold (equally when unknown).
- **waste**: owned capacity minus the GPU-time delivered on it, by anyone: an idle silo of 8 cards
  wastes 8, a notebook node at 10% wastes most of its cards, a saturated team almost nothing.
"""
