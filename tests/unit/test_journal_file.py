"""A zero-length or foreign file at the journal path is refused with one clear line unless `--new-journal` says
otherwise (issue 24); a new journal is created whole or not at all."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal, JournalError
from tailguard.controller.adapters.stores.journal_file import creating_path
from tailguard.controller.app.build import build
from tailguard.controller.app.cli import _parser
from tailguard.controller.app.settings import load_settings
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.kit.errors import ConfigError

NOW = 1_700_000_000.0


def _foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    db.execute("INSERT INTO invoices (total) VALUES (12.5)")
    db.commit()
    db.close()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b""), "is an empty file (0 bytes), not a journal"),
        (_foreign, "is a SQLite database but not a tailguard journal (no meta.schema_version; its tables: invoices)"),
        (lambda p: p.write_bytes(b"not a database at all\n" * 200), "is not a SQLite database"),
    ],
    ids=["empty", "foreign", "not-sqlite"],
)
def test_a_file_that_is_not_a_journal_is_refused_in_one_line_and_left_as_it_was(
    tmp_path: Path, make: object, says: str
) -> None:
    path = tmp_path / "tailguard.db"
    make(path)  # type: ignore[operator]
    before = path.read_bytes()
    with pytest.raises(JournalError) as refused:
        Journal(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"journal {path} {says}")
    assert message.endswith("refusing to start on it (pass --new-journal to set it aside and start a new journal)")
    assert path.read_bytes() == before  # nothing written into it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tailguard.db"]


def test_a_write_ahead_log_without_its_journal_is_refused_and_new_journal_sets_it_aside(tmp_path: Path) -> None:
    path = tmp_path / "tailguard.db"
    Path(f"{path}-wal").write_bytes(b"frames of a journal whose main file is gone")
    with pytest.raises(JournalError, match=r"is missing but its write-ahead log .*-wal is there; refusing"):
        Journal(path)
    with Journal(path, new_journal=True, now=NOW) as journal:
        assert journal.policy_names() == []
    assert (tmp_path / f"tailguard.db.set-aside-{int(NOW)}-wal").read_bytes().startswith(b"frames")


def test_a_directory_is_refused_even_with_new_journal(tmp_path: Path) -> None:
    (tmp_path / "tailguard.db").mkdir()
    with pytest.raises(JournalError, match=r"tailguard\.db is a directory; the journal path names a file"):
        Journal(tmp_path / "tailguard.db", new_journal=True, now=NOW)
    assert (tmp_path / "tailguard.db").is_dir()


def test_new_journal_sets_the_file_aside_and_starts_a_new_journal(tmp_path: Path) -> None:
    path = tmp_path / "tailguard.db"
    _foreign(path)
    with Journal(path, new_journal=True, now=NOW) as journal:
        journal.commit_evaluation("p", PolicyState(evaluations=1, last_evaluated_at=NOW), [], NOW)
    aside = tmp_path / f"tailguard.db.set-aside-{int(NOW)}"
    rows = sqlite3.connect(aside).execute("SELECT total FROM invoices").fetchall()
    assert rows == [(12.5,)]  # the other program's data is kept, untouched
    with Journal(path) as reopened:  # a journal now: opens without --new-journal
        assert reopened.policy_names() == ["p"]


def test_a_journal_is_opened_as_before_and_new_journal_changes_nothing_for_it(tmp_path: Path) -> None:
    path = tmp_path / "tailguard.db"
    with Journal(path) as journal:
        journal.commit_evaluation("p", PolicyState(evaluations=3, last_evaluated_at=NOW), [], NOW)
    with Journal(path, new_journal=True, now=NOW) as reopened:
        state = reopened.load_state("p")
    assert state is not None and state.evaluations == 3
    assert sorted(p.name for p in tmp_path.iterdir() if "set-aside" in p.name) == []


def test_a_new_journal_is_created_whole_and_a_killed_creation_leaves_nothing_at_the_path(tmp_path: Path) -> None:
    path = tmp_path / "state" / "tailguard.db"
    path.parent.mkdir()
    creating_path(path).write_bytes(b"half made")  # a creation killed before its rename
    with Journal(path):
        pass
    assert not creating_path(path).exists()
    assert path.stat().st_size > 0  # the schema is in the main file, not only in a WAL
    Journal(path).close()  # and it is a journal


def test_the_controller_refuses_an_empty_journal_with_one_line_and_new_journal_starts_it(tmp_path: Path) -> None:
    (tmp_path / "tailguard.db").write_bytes(b"")
    config = tmp_path / "config.yaml"
    config.write_text(
        "prometheus: {url: 'http://127.0.0.1:9'}\npolicies: [rules]\njournal: tailguard.db\n"
        "listen: '127.0.0.1:0'\nannotations: {path: annotations.jsonl}\n"
    )
    settings = load_settings(config)
    with ExitStack() as stack, pytest.raises(ConfigError) as refused:
        build(settings, stack, webhook_token=None)
    # `tailguard run` prints it as "{config}: {message}", its one line on stderr (exit 2)
    assert "\n" not in str(refused.value)
    assert "tailguard.db is an empty file (0 bytes), not a journal; refusing to start on it" in str(refused.value)
    assert (tmp_path / "tailguard.db").stat().st_size == 0
    assert _parser().parse_args(["run", "--config", str(config), "--new-journal"]).new_journal is True
    with ExitStack() as stack:
        build(settings, stack, webhook_token=None, new_journal=True)
    assert Journal(tmp_path / "tailguard.db").policy_names() == []


def test_a_file_holding_only_the_incident_store_is_tailguards_and_becomes_a_journal(tmp_path: Path) -> None:
    """Without a cluster the incidents live in the journal's file (adapters/stores/incidents.py); a store opened
    there first leaves a file with only its table, which the journal takes as its own (not a foreign database)."""
    path = tmp_path / "journal.db"
    SqliteIncidentStore(path).close()
    journal = Journal(path)
    assert journal.schema_version() >= 1
    journal.close()
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"incidents", "meta"} <= tables
