"""Every key of every screen, written once: the bindings are made from these lists and the help
screen prints them, so help cannot forget a key. Keys follow k9s (see docs/tui.md)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    """One key: how Textual names it, how help shows it, what it does.

    `action` None: the key is handled by a widget on the screen (a table's cursor keys)."""

    keys: str
    label: str
    description: str
    action: str | None = None
    priority: bool = False


def bindings(keys: tuple[Key, ...]) -> list[Binding]:
    return [
        Binding(k.keys, k.action, k.description, show=False, priority=k.priority) for k in keys if k.action
    ]


GLOBAL_KEYS: tuple[Key, ...] = (
    Key("question_mark", "?", "help: the keys of this screen, the commands and the colours", "help"),
    Key(
        "colon",
        ":",
        "command bar: :gpus :nodes :tenants :processes :events :pool :q (Tab completes)",
        "command",
        priority=True,
    ),
    Key(
        "slash",
        "/",
        "filter rows by a regular expression (case-insensitive); /!re hides matches",
        "filter",
        priority=True,
    ),
    Key("escape", "esc", "leave the command or filter bar; clear the filter; go back", "back"),
    Key("q", "q", "quit", "quit"),
    Key("ctrl+c", "ctrl-c", "quit", "quit", priority=True),
)

TABLE_KEYS: tuple[Key, ...] = (
    Key("up,down", "↑ ↓  j k", "move the cursor"),
    Key("pageup,pagedown", "PgUp PgDn", "scroll a page"),
    Key("home,end", "Home End", "first / last row"),
)


def sort_keys(sorts: dict[str, tuple[str, str]]) -> tuple[Key, ...]:
    """Shift-letter sort keys: {"N": ("name", "node name")} -> Key("N", "N", "sort by node name ...")."""
    return tuple(
        Key(
            letter,
            f"Shift-{letter}",
            f"sort by {what} (again: reverse)",
            f"sort('{name}')",
        )
        for letter, (name, what) in sorts.items()
    )
