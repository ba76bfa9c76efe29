"""A live one-line status per waiting call in Jupyter (a plain
``display(..., display_id=True)`` updated in place, no widget packages);
nothing at all in a plain terminal."""

from __future__ import annotations

import sys
import time


def in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        ip = ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


class StatusLine:
    """One updatable output line, or a no-op outside a notebook."""

    def __init__(self, label: str):
        self.label = label
        self.t0 = time.monotonic()
        self.handle = None
        self.last: str | None = None
        if in_notebook():
            try:
                from IPython.display import display

                self.handle = display({"text/plain": self._text("submitted")}, raw=True, display_id=True)
            except Exception:  # noqa: BLE001 - a status line is never worth an error
                self.handle = None

    def _text(self, state: str) -> str:
        return "delegate: %s — %s, %.0fs" % (self.label, state, time.monotonic() - self.t0)

    def update(self, state: str, final: bool = False) -> None:
        if self.handle is None:
            return
        text = self._text(state)
        if text == self.last:
            return
        self.last = text
        try:
            self.handle.update({"text/plain": text}, raw=True)
        except Exception:  # noqa: BLE001
            self.handle = None
        if final:
            self.handle = None
