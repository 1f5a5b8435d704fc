"""How many examples a property test draws, by the run's profile (GPUOPS_HYPOTHESIS_PROFILE).

A test names its full count, `@settings(max_examples=examples(300))`; the profile scales it:

- `ci` (`.ci/run`): half, derandomized (tests/conftest.py), so a submission lands on its merits
  and the suite keeps to its 9 minutes;
- unset (`make test`): the full count, drawn anew each run;
- `deep` (`make test-deep`): four times the full count, drawn anew: the separate, longer search.
"""

from __future__ import annotations

import os

SCALES = {"ci": 0.5, "deep": 4.0}
FLOOR = 20  # fewer than this finds little; a test that asks for fewer keeps its own count


def examples(full: int) -> int:
    scale = SCALES.get(os.environ.get("GPUOPS_HYPOTHESIS_PROFILE", ""), 1.0)
    return max(min(full, FLOOR), round(full * scale))
