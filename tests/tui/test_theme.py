"""Every colour of the TUI is a name in gpuops/tui/theme.py: no colour literal anywhere else in
gpuops/tui/ (a hex colour, a Rich style string that names a colour, a CSS colour that is not a
Textual variable). The colours themselves are held by the SVG snapshots (test_snapshots.py)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
from rich.color import ANSI_COLOR_NAMES

from gpuops.tui import theme

TUI = Path(__file__).resolve().parents[2] / "gpuops" / "tui"

_HEX = re.compile(r"#(?:[0-9a-fA-F]{6}|[0-9a-fA-F]{3})\b(?![-\w])")
_CSS = re.compile(r"\b(?:color|background(?:-color)?)\s*:\s*(?![$\s{])([^;}]+)")
_ATTRIBUTES = {"bold", "dim", "italic", "underline", "reverse", "blink", "strike", "not", "on", "b", "i", "u"}
_COLOURS = set(ANSI_COLOR_NAMES) | {"default"}
# Python 3.12 cuts an f-string into tokens: its literal parts are FSTRING_MIDDLE
_STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def colour_literals(source: str) -> list[tuple[int, str]]:
    """(line, string) of each string literal in `source` that holds a colour literal."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _STRINGS:
            continue
        prefix = re.match(r"[a-zA-Z]*", token.string)
        text = token.string
        if prefix is not None and "f" in prefix.group().lower():
            # an f-string's fields are names, not literals; its doubled braces are text
            text = text.replace("{{", "\0").replace("}}", "\1")
            text = re.sub(r"\{[^{}]*\}", " ", text).replace("\0", "{").replace("\1", "}")
        words = re.sub(r"^[a-zA-Z]*(\"\"\"|'''|\"|')|(\"\"\"|'''|\"|')$", "", text).split()
        style = bool(words) and all(w in _ATTRIBUTES or w in _COLOURS or _HEX.fullmatch(w) for w in words)
        if _HEX.search(text) or _CSS.search(text) or (style and any(w in _COLOURS for w in words)):
            found.append((token.start[0], token.string))
    return found


OUTSIDE = sorted(p for p in TUI.rglob("*.py") if p.name != "theme.py")


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(TUI)))
def test_no_colour_literal_outside_the_theme(path: Path) -> None:
    assert colour_literals(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_what_it_looks_for() -> None:
    source = '''
a = Style(color="#ffd75f")
b = "bold red"
c = Text("x", style="yellow")
d = "bold #000000 on #ffaf00"
e = f"bold {theme.IDLE}"
f = "a grey cell is idle (under 5%)"
g = """
    #tenants-notice { color: #ffaf00; }
    Bar { color: red; background: $panel; }
    """
h = "dim"
i = "#pool-head"
j = f"""
    #notice {{ color: {theme.NOTICE}; }}
    """
k = "Bar { color: red; }"
l = f"bold #ffd75f {x}"
'''
    assert [line for line, _ in colour_literals(source)] == [2, 3, 4, 5, 8, 17, 18]


def test_every_theme_colour_is_a_colour() -> None:
    from rich.color import Color

    names = [n for n in dir(theme) if n.isupper()]
    assert names
    for name in names:
        value = getattr(theme, name)
        pairs = value if isinstance(value, tuple) and isinstance(value[0], tuple) else (value,)
        for colours in pairs:
            for colour in colours if isinstance(colours, tuple) else (colours,):
                Color.parse(colour)  # raises on anything Rich would not draw
