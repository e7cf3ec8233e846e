"""A journal damaged inside (issue 21, findings 7 and 24): a line that is no record, or a
journal that does not begin by creating its study, was not left by a writer that stopped
mid-write.  It is refused — by ``study show``, ``study best`` and ``study run`` alike — in
one paragraph naming the file and the line, and nothing is changed: never cut out (that
lost the create-study record and orphaned the trials) nor appended to as a new study."""

from __future__ import annotations

import pytest

from crossflow.search.study import load_study, run_study


@pytest.fixture
def journal(tmp_path):
    path = tmp_path / "q.journal"
    run_study(load_study("quickstart"), n_trials=4, storage=str(path), track=False,
              progress=False)
    return path


def _lines(path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def _damage(journal, how: str) -> int:
    """Damage ``journal`` as ``how`` says; the line number the message must name."""
    lines = _lines(journal)
    if how == "first record":
        lines[0] = lines[0].replace(b'"op_code"', b'"op_cod\xe9"', 1)[:-7]
        line = 1
    elif how == "first record lost":
        lines.pop(0)
        line = 1
    elif how == "a middle record":
        line = len(lines) // 2
        lines[line - 1] = b"#" + lines[line - 1][1:]
    else:
        raise AssertionError(how)
    _write(journal, lines)
    return line


@pytest.mark.parametrize("how", ["first record", "first record lost", "a middle record"])
@pytest.mark.parametrize("command", ["show", "best", "run"])
def test_a_journal_damaged_inside_is_refused_and_left_as_it_is(cli, journal, how, command):
    line = _damage(journal, how)
    before = journal.read_bytes()
    extra = ("--trials", "6", "--no-tracking", "--quiet") if command == "run" else ()
    code, out, err = cli("study", command, "quickstart", "--storage", journal, *extra)
    assert code == 2, (out, err)
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    assert str(journal) in err and f"line {line}" in err, err
    assert "damaged" in err and "nothing was changed" in err, err
    assert journal.read_bytes() == before
    assert not journal.with_name("q.journal.torn").exists()


def test_a_repaired_glued_record_is_said_where_it_was(cli, journal):
    """A torn record with the next one glued on, mid-journal: the note names the line, not
    'the journal ended in a record that was not finished'."""
    lines = _lines(journal)
    lines[3] = b'{"op_code":4,"wor' + lines[3]
    _write(journal, lines)
    code, _, err = cli("study", "show", "quickstart", "--storage", journal)
    assert code == 0, err
    assert "line 4 began with a record that was not finished" in err, err
    assert "ended in" not in err, err
