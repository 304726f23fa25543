"""Errors a user can cause. The HTTP layer turns them into 400 responses."""


class RadixflowError(ValueError):
    """Bad input from a user: the message says what to change."""


class ServerBusyError(RadixflowError):
    """The runtime could not take the request now (an HTTP 503): retry later, or give it more
    capacity (the message says which flag)."""


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
