"""Failures the storage layer reports in domain terms."""


class Duplicate(Exception):
    """A row with the same unique value exists already."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
