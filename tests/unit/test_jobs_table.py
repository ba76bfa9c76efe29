"""``delegate.jobs()``'s table (no cluster needed): the machine column and
the note when the listed results ran on more than one hardware class."""

from __future__ import annotations

from delegate._jobs import JobTable


def row(job: str, cpu: str | None, machine: str | None) -> dict:
    return {
        "id": job,
        "what": "f()",
        "state": "completed",
        "outcome": "done",
        "host": "w1",
        "cpu": cpu,
        "machine": machine,
    }


def test_a_call_that_ran_again_says_so():
    """Issue 52: a call whose node was lost and that ran again shows its
    history in the table, completed or still running."""
    done = dict(
        row("a", "AMD EPYC", "X"), reason="exited with code 0; ran again on w1 (attempt 2): w2 was lost"
    )
    table = JobTable([done, row("b", "AMD EPYC", "X")])
    assert "ran again on w1 (attempt 2): w2 was lost" in str(table)
    assert "ran again on w1 (attempt 2): w2 was lost" in table._repr_html_()
    assert "exited with code 0" not in str(table)


def test_one_class_has_no_note_and_two_are_named():
    one = JobTable([row("a", "AMD EPYC", "X"), row("b", "AMD EPYC", "X"), row("c", None, None)])
    assert one.classes() == ["X"]
    assert "machine classes" not in str(one) and "delegate-classes" not in one._repr_html_()
    assert "AMD EPYC" in str(one) and "MACHINE" in str(one)
    two = JobTable([row("a", "AMD EPYC", "X"), row("b", "Intel Xeon", "Y <b>")])
    text = str(two)
    assert (
        text.splitlines()[-1]
        == "note: these results ran on 2 machine classes; compare only results of one: X; Y <b>"
    )
    html = two._repr_html_()
    assert html.startswith("<table class='delegate-jobs'>") and "class='delegate-classes'" in html
    assert "Y &lt;b&gt;" in html and "Y <b>" not in html
