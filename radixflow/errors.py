"""Errors a user can cause (the HTTP layer answers them with 400), and the busy error (503)."""


class RadixflowError(ValueError):
    """Bad input from a user: the message says what to change."""


class ServerBusyError(Exception):
    """The runtime could not take the request now (an HTTP 503): retry later, or give it more
    capacity (the message says which flag). Not a RadixflowError: the input was fine, and the
    handlers that answer a RadixflowError with a 400 must let it through."""


class ModelPathError(RadixflowError):
    """A model path that is missing or does not hold what we expect."""


class GrammarError(RadixflowError):
    """A grammar (JSON schema, regex, EBNF) that cannot be compiled or enforced exactly.

    `keyword` names the JSON-schema keyword at fault (None when the fault is not one
    keyword) and `pointer` its JSON pointer in the schema ("" = the root)."""

    def __init__(self, message: str, keyword: "str | None" = None, pointer: "str | None" = None):
        super().__init__(message)
        self.keyword = keyword
        self.pointer = pointer
