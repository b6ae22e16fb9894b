"""The one exception type for user errors: bad input, missing files, incompatible models.

The CLI prints these as one line without a traceback; anything else is a bug and keeps its traceback.
"""


class SpecdecError(ValueError):
    """A user-facing error with a message that says what to change."""
