"""History on the node: bounded minute and hour rollups of samples, kept in a directory
(docs/history.md). The figures are gpuops/core/history.py's; here, by concern:

- `rollup.py`: samples integrated into minute and hour buckets (`Rollup`: in memory only, the
  simulator's past; the accumulators the recorder fills too);
- `files.py`: the directory's files (`hours-YYYYMMDD.json`, `minutes.json`), how long they keep
  buckets, their layout, reading one (`read_file`, `FileError`);
- `recorder.py`: `Recorder`, which keeps the files (atomic writes, pruning, files moved aside,
  one recorder per directory);
- `reader.py`: `read_history`, the agent's `history` request;
- `service.py`: `run_recorder`, the service mode (`gpuops agent --record`).

Import what you use from its module: this package imports none of them, so the agent reading
history does not load the recorder, nor the recorder the reader.

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""
