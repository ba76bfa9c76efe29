"""``delegate.jobs()``: the student's recent jobs as a table — HTML in a
notebook (``_repr_html_``), plain text in a terminal (``str``/``repr``).
Columns: id, function or command, state (coloured), node, elapsed time,
submitted; the reason of a job that did not complete follows its state."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from delegate import _backends

if TYPE_CHECKING:
    from delegate._core import JobRecord
from delegate._display import seconds
from delegate._futures import known_future

#: The colour of each state in the HTML table (the CLI's `delegate list`
#: uses the same on a terminal).
STATE_COLOURS = {
    "pending": "#777777",
    "running": "#1f6fb2",
    "completed": "#2e7d32",
    "failed": "#c62828",
    "timed-out": "#c62828",
    "lost": "#c62828",
    "cancelled": "#b26a00",
}
COLUMNS = ("id", "function or command", "state", "node", "machine", "elapsed", "submitted")


def _when(t) -> str:
    if not t:
        return "-"
    lt = time.localtime(t)
    if time.strftime("%Y-%m-%d", lt) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", lt)
    return time.strftime("%Y-%m-%d %H:%M", lt)


def _words(row: dict) -> str:
    """The state in the user's words when this process knows the call's
    outcome (``raised ZeroDivisionError``), else the job's state."""
    fut = known_future(str(row.get("id", "")))
    if fut is not None and fut._words is not None:
        return fut._words
    if fut is not None and row.get("state") in ("pending", "running"):
        return fut._words_now()
    return str(row.get("outcome") or row.get("state", "?"))


class JobTable(list["JobRecord"]):
    """A list of job dicts (``id``, ``what``, ``state``, ``outcome``,
    ``reason``, ``host``, ``elapsed``, ``submitted``...) that shows itself as
    a table."""

    def _cells(self, row: Mapping[str, Any]) -> tuple[Any, ...]:
        el = row.get("elapsed")
        return (
            str(row.get("id", "")),
            str(row.get("what", "") or "?"),
            str(row.get("outcome", row.get("state", ""))),
            str(row.get("host") or "-"),
            str(row.get("cpu") or "-"),
            "-" if el is None else seconds(float(el)),
            _when(row.get("submitted")),
        )

    def _reason(self, row: Mapping[str, Any]) -> str:
        reason = str(row.get("reason", "") or "")
        if row.get("state") in ("pending", "running", "completed"):
            # (a call that ran again after its node was lost says so)
            at = reason.find("ran again on ")
            return reason[at:] if at >= 0 else ""
        return "" if reason and reason in str(row.get("outcome", "")) else reason

    def classes(self) -> list[str]:
        """The hardware classes the listed calls ran on (a class: CPU model,
        stepping, microcode, governor, boost, kernel); results of different
        classes should not be compared."""
        return sorted({str(r["machine"]) for r in self if r.get("machine")})

    def _classes_note(self) -> str:
        classes = self.classes()
        if len(classes) < 2:
            return ""
        return "note: these results ran on %d machine classes; compare only results of one: %s" % (
            len(classes),
            "; ".join(classes),
        )

    def __str__(self) -> str:
        if not self:
            return "no jobs"
        rows = [tuple(c.upper() for c in COLUMNS)] + [self._cells(r) for r in self]
        widths = [min(48, max(len(r[i]) for r in rows)) for i in range(len(COLUMNS))]
        lines = []
        for n, r in enumerate(rows):
            cells = [c if len(c) <= w else c[: w - 1] + "…" for c, w in zip(r, widths)]
            line = "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
            if n > 0:
                reason = self._reason(self[n - 1])
                if reason:
                    line += "  (" + reason + ")"
            lines.append(line)
        note = self._classes_note()
        return "\n".join(lines + ([note] if note else []))

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_html_(self) -> str:
        head = "".join("<th style='text-align:left'>%s</th>" % html.escape(c) for c in COLUMNS)
        body = []
        for row in self:
            cells = self._cells(row)
            state_name = str(row.get("state", ""))
            if str(row.get("outcome", "")).startswith(("raised", "failed")):
                state_name = "failed"  # the job completed, the call did not
            colour = STATE_COLOURS.get(state_name, "inherit")
            reason = self._reason(row)
            state = "<span style='color:%s;font-weight:bold'>%s</span>" % (colour, html.escape(cells[2]))
            if reason:
                state += "<br><small style='color:#555'>%s</small>" % html.escape(reason)
            tds = [
                "<td><code>%s</code></td>" % html.escape(cells[0]),
                "<td><code>%s</code></td>" % html.escape(cells[1]),
                "<td class='delegate-state' data-state='%s'>%s</td>"
                % (html.escape(str(row.get("state", ""))), state),
            ] + ["<td>%s</td>" % html.escape(c) for c in cells[3:]]
            body.append("<tr>%s</tr>" % "".join(tds))
        if not body:
            body.append("<tr><td colspan='%d'>no jobs</td></tr>" % len(COLUMNS))
        note = self._classes_note()
        foot = (
            "<tfoot><tr><td colspan='%d' class='delegate-classes' style='color:#e65100'>%s</td></tr></tfoot>"
            % (len(COLUMNS), html.escape(note))
            if note
            else ""
        )
        return "<table class='delegate-jobs'><thead><tr>%s</tr></thead><tbody>%s</tbody>%s</table>" % (
            head,
            "".join(body),
            foot,
        )


def jobs(limit: int = 20, backend: str | None = None) -> JobTable:
    """Your ``limit`` most recent jobs (oldest first) as a ``JobTable``: an
    HTML table in a notebook, plain text in a terminal. With the local
    backend (``backend="local"`` or ``DELEGATE_BACKEND=local``): this
    process's local calls."""
    if limit < 0:
        raise ValueError("limit must be >= 0")
    rows = _backends.named(backend).recent(limit)
    for r in rows:
        r["outcome"] = _words(r)
    return JobTable(rows)
