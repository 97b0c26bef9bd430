"""The exception tree (``cairn.errors``): an error's field, expected and found; each class's retry
policy and exit code; errors that travel between processes by name."""

from __future__ import annotations

from cairn.errors import GangFailedError, IntegrityError, error_named


def test_config_error_names_the_field_with_expected_and_found() -> None:
    from cairn.errors import ConfigError

    err = ConfigError("steps", expected=">= 0", found=-3)
    assert str(err) == "steps: expected >= 0, found -3" and err.field == "steps"
    assert ConfigError("x: free text").field is None


def test_error_policy_is_declared_on_the_classes() -> None:
    from cairn import errors as E

    assert E.StorageError.retryable and E.StorageError.exit_code == 3
    assert not E.CheckpointError.retryable and E.IntegrityError.exit_code == 1
    assert E.ConfigError.exit_code == 2 and E.ReferenceSyntaxError.exit_code == 2
    assert E.EffectUnavailableError.retryable and E.EffectUnavailableError.exit_code == 4
    assert not E.InvalidObjectError.retryable and E.TemporalUnavailableError.exit_code == 5


def test_typed_errors_travel_between_processes_by_name() -> None:
    err = error_named("IntegrityError", "rank 1: bad bytes")
    assert isinstance(err, IntegrityError) and not err.retryable and "bad bytes" in str(err)
    other = error_named("NoSuchError", "boom")
    assert isinstance(other, GangFailedError) and other.retryable
