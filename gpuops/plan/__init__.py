"""Plan and apply: fleet.yaml's `carve:` against the live state of each node (see cli/plan.py)."""
