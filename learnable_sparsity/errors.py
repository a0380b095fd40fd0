"""The project's one exception type (and the one kind of it callers tell apart).

Every error caused by bad input (a params key, a data file, a checksum, a NaN loss, a device
request) is raised as :class:`LearnableSparsityError` with a message naming the offending
key / file / value, so that callers and tests can catch exactly these and let bugs through.
"""


class LearnableSparsityError(ValueError):
    """Bad input or an unrecoverable run condition; the message names what is at fault."""


class MissingInputError(LearnableSparsityError):
    """An input file another stage writes is not there (its message says which, and how to
    make it); a sweep submitted without its data says how to send them along."""
