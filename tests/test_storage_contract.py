"""Optuna's own storage contract (``optuna.testing.pytest_storages.StorageTestCase``) run on
the storages CrossFlow builds (:func:`crossflow.search.storage.make_storage`): the resilient
RDB storage on SQLite (and on PostgreSQL where ``CROSSFLOW_TEST_POSTGRES`` is set, see
tests/conftest.py), and the journal file.  The resilient storage holds a trial's user
attributes back until the trial finishes; the contract checks that no caller can tell."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from optuna.storages import JournalStorage
from optuna.study import StudyDirection
from optuna.testing.pytest_storages import StorageTestCase
from optuna.trial import TrialState

from crossflow.search.storage import make_storage, resilient_rdb_storage_class


@pytest.fixture
def fast_dir(tmp_path):
    """A folder in memory where there is one (/dev/shm): the contract commits thousands of
    small transactions, each an fsync on disk (~90 s on a busy machine, ~20 s in memory)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="crossflow-contract-") as folder:
        yield Path(folder)


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def storage(request, fast_dir):
    if request.param == "sqlite":
        url = f"sqlite:///{fast_dir}/contract.db"
    elif request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")  # skips without CROSSFLOW_TEST_POSTGRES
    else:
        url = str(fast_dir / "contract.journal")
    backend = make_storage(url, reconnect_s=2.0)
    yield backend
    if hasattr(backend, "engine"):
        backend.remove_session()
        backend.engine.dispose()


class TestCrossflowStorages(StorageTestCase):
    """Every test of Optuna's contract, on each storage of the ``storage`` fixture."""


def test_the_contract_runs_on_crossflows_classes(tmp_path):
    """The fixture builds CrossFlow's resilient subclass and a journal storage (a change
    to make_storage that returned something else would leave the contract untested)."""
    rdb = make_storage(f"sqlite:///{tmp_path}/c.db")
    assert isinstance(rdb, resilient_rdb_storage_class())
    assert isinstance(make_storage(str(tmp_path / "c.journal")), JournalStorage)


def test_held_back_user_attributes_are_seen_and_written_on_finish(tmp_path):
    """A running trial's user attributes wait in the process (one write at the end), yet
    every reader sees them, and a second storage on the same database sees them once the
    trial has finished."""
    url = f"sqlite:///{tmp_path}/held.db"
    storage = make_storage(url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="held")
    trial_id = storage.create_new_trial(study_id)
    storage.set_trial_user_attr(trial_id, "a", 1)
    assert trial_id in storage._user_attrs  # held back, not written
    assert storage.get_trial(trial_id).user_attrs == {"a": 1}
    assert storage.get_all_trials(study_id)[0].user_attrs == {"a": 1}
    other = make_storage(url)
    assert other.get_trial(trial_id).user_attrs == {}
    storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
    assert other.get_trial(trial_id).user_attrs == {"a": 1}
    assert storage._user_attrs == {}
