"""The store's own error, in a module without torch so that light commands (`rcswarm status`, `rcswarm fit`)
can catch it without importing the store's checkpoint code."""


class StoreError(Exception):
    """A state dir's database failed under the store: it cannot be opened, is not a database or not a
    coordinator's, is locked, or its disk is full (`full`). The message names the file and what failed; the
    sqlite3 error is its cause."""

    def __init__(self, message: str, full: bool = False) -> None:
        super().__init__(message)
        self.full = full
