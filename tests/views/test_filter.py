"""The `/` filter (gpuops.views.filter)."""

from __future__ import annotations

import pytest

from gpuops.views.filter import FilterError, parse_filter


def test_filter_parsing() -> None:
    assert parse_filter("") is None and parse_filter("!") is None
    flt = parse_filter("!Vis")
    assert flt is not None and flt.inverse and not flt.matches("vision") and flt.matches("speech")
    with pytest.raises(FilterError, match="not a regular expression"):
        parse_filter("vision(")
