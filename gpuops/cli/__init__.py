"""The `gpuops` command line (typer). Presents and collects intent; logic lives below."""
