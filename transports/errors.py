"""The errors every part of the engine raises; re-exported by `collectives`.

Everything derives from `CollectiveError`. A bad argument is also a `ValueError` or a
`TypeError`, as Python code expects, and is raised before this rank sends anything.
"""


class CollectiveError(RuntimeError):
    """Base class of every error raised by a collective or a transport."""


class InvalidArgumentError(CollectiveError, ValueError):
    """A bad argument (a recvbuf's shape or dtype, an op, a root): nothing was sent."""


class InvalidTypeError(CollectiveError, TypeError):
    """An argument of the wrong type (not an array, NumPy mixed with CuPy): nothing was sent."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A wait ran past the communicator's timeout (also a builtin `TimeoutError`)."""


TimeoutError = CollectiveTimeoutError  # the name it had before; shadows the builtin only here


class MismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different arguments."""


class CallsDiffer(MismatchError):
    """Ranks made different calls. `calls` holds every rank's call descriptor (six
    non-negative integers, see collectives/check.py) in rank order; the communicator turns it
    into a MismatchError that says what differs."""

    def __init__(self, calls: list[tuple[int, ...]]) -> None:
        super().__init__(f"ranks made different calls: {calls}")
        self.calls = calls


class PeerFailedError(CollectiveError):
    """Another rank failed, so this rank stopped waiting for it."""
