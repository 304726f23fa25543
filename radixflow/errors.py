"""Errors a user can cause. The HTTP layer turns them into 400 responses."""


class RadixflowError(ValueError):
    """Bad input from a user: the message says what to change."""


class ModelPathError(RadixflowError):
    """A model path that is missing or does not hold what we expect."""
