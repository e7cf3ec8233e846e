"""What samplers need of a study's trials, storage-independent (Optuna's own samplers make
the same calls): process-unique keys, attributes written straight to the storage, and
Optuna's check that a value belongs to a distribution.

The samplers' sub-layer sits below the runtime (storage, workers, tracking): they import
this module, never :mod:`crossflow.search.storage`.
"""

from __future__ import annotations


def study_key(study) -> tuple[int, int]:
    """A key of ``study`` unique in this process: (its storage object, its id there)."""
    return id(study._storage), study._study_id


def trial_key(study, trial) -> tuple[int, int]:
    """A key of ``trial`` unique in this process: (its storage object, its trial id)."""
    return id(study._storage), trial._trial_id


def set_trial_attrs(study, trial, *, system: dict | None = None,
                    user: dict | None = None) -> None:
    """Write system then user attributes of the running ``trial`` straight to the storage
    (in the order given: a sampler's last key may mark the others as complete)."""
    for key, value in (system or {}).items():
        study._storage.set_trial_system_attr(trial._trial_id, key, value)
    for key, value in (user or {}).items():
        study._storage.set_trial_user_attr(trial._trial_id, key, value)


def stored_trial(study, trial):
    """``trial`` as the storage has it now (another process may have written to it)."""
    return study._storage.get_trial(trial._trial_id)


def all_trials(study) -> list:
    """Every trial of ``study`` without copying them (read-only)."""
    return study._storage.get_all_trials(study._study_id, deepcopy=False)


def contains(distribution, value) -> bool:
    """Whether ``value`` (external representation) is a valid value of ``distribution``
    (Optuna's own check, a private method of its distributions)."""
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False
