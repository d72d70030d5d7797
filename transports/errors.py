"""The errors every part of the engine raises; re-exported by `collectives`."""


class CollectiveError(RuntimeError):
    """Base class of every error raised by a collective or a transport."""


class TimeoutError(CollectiveError):
    """A wait ran past the communicator's timeout."""


class MismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different arguments."""


class PeerFailedError(CollectiveError):
    """Another rank failed, so this rank stopped waiting for it."""
