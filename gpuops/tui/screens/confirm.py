"""A yes/no question before an action that changes the fleet: y answers yes; n, esc or q no.
Enter is not an answer, so that a key meant for the screen below cannot apply anything."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 100; max-width: 100%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 0 1; }
    ConfirmScreen #confirm-title { text-style: bold; color: $warning; }
    ConfirmScreen #confirm-keys { margin-top: 1; color: $text-muted; }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "yes", show=False),
        Binding("n,escape,q", "answer(False)", "no", show=False),
    ]

    def __init__(self, title: str, body: Text | str, yes: str = "y: yes") -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="confirm-title")
            yield Static(self.body, id="confirm-body")
            yield Static(f"{self.yes}   ·   n, esc or q: no, nothing is changed", id="confirm-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
