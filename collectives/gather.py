"""Gather to a root: block r of the root's result comes from rank r.

Every rank but the root sends its block straight to the root, which takes them in turn,
starting with its right neighbour: scatter.py, the other way round. With root 0 of 4 ranks, as
"sent/received" block numbers ("-": nothing; a test checks the table against the code):

        1 ---+
             v
        2 -> 0       each arrow: one message of one block
             ^
        3 ---+

    phase   step   rank 0   rank 1   rank 2   rank 3
    gather  0      -/1      1/-      -        -
    gather  1      -/2      -        2/-      -
    gather  2      -/3      -        -        3/-

The root receives the N-1 blocks it lacks, (N-1)/N S of a result of S bytes, and every other
rank sends its block once, S/N: the least a gather can move. The senders all start at once
(on shared memory each copies into its own slots, so the root's receives follow one another
without waiting), and the root copies its own block with the first (`recv_while`: first, or
on shared memory, where that sender shares its message, while it writes it whole into the
root's result).
A binomial tree would cut the root's N-1 steps to log2 N by forwarding blocks through other
ranks: worth it where each message pays a long latency, not between the cores of one node.

Uneven blocks (`counts`, MPI's Gatherv) follow the same schedule with uneven bounds.

Small equal blocks take one exchange instead (`one_shot_gather`): every rank publishes its
block in its one-shot area, and the root copies them out; one wait instead of N-1 steps. (The
root's own goes nowhere, `Transport.unread`; a block in registered memory is left where it
lies, and the root copies it from there: see transports/slots.py, "Registered memory".)
"""

from __future__ import annotations

from typing import Any, Callable

from transports.base import Reads, Transport

from .blocks import to_root


def gather_to_root(transport: Transport, mine: Any | None, work: Any,
                   bounds: list[tuple[int, int]], root: int) -> None:
    """Send the flat array `mine` (block `rank`) to `root`, which fills its flat result `work`
    with block r from rank r at `bounds[r]`. At the root `mine` is copied into its own block,
    unless it is None: already in place. Other ranks' `work` is not used."""
    rank, size = transport.rank, transport.size
    if rank != root:
        transport.at("gather", (rank - root) % size - 1)
        transport.send(mine, root)
        return
    own = work[slice(*bounds[root])]

    def copy_own() -> None:
        own[...] = mine
    if mine is not None and (size == 1 or transport.xp.may_share_memory(mine, work)):
        copy_own()  # first: `mine` may overlap the peers' blocks
        mine = None
    for step in range(size - 1):
        peer = (root + 1 + step) % size
        transport.at("gather", step)
        if step == 0 and mine is not None:  # our own block copied with the first peer's
            transport.recv_while(work[slice(*bounds[peer])], peer, copy_own)
        else:
            transport.recv(work[slice(*bounds[peer])], peer)


def one_shot_gather(transport: Transport, mine: Any | None, work: Any | None,
                    bounds: list[tuple[int, int]], root: int) -> None:
    """The gather of equal blocks (at `bounds`) in one exchange: every rank publishes its flat
    block `mine`, and the exchange places each peer's in the root's flat result `work`
    (`to_root`: it may read them straight there, out of registered memory), where the root
    copies its own with the exchange (`alongside`: on shared memory during it, where the
    inputs are read in place, while a peer that shares its input writes its part; else
    after it), or first where `mine` overlaps them, unless `mine` is None: already in
    place."""
    own = None if work is None else work[slice(*bounds[root])]
    if mine is not None and own is not None:
        def copy_own() -> None:
            own[...] = mine
        if transport.xp.may_share_memory(mine, work):
            copy_own()  # first: `mine` may overlap the peers' blocks (none reads it)
        else:
            transport.alongside(copy_own)
    inputs_at_root(transport, own if mine is None else mine, root,
                   lambda src: work[slice(*bounds[src])],
                   to_root(own.nbytes if mine is None else mine.nbytes, root, transport.rank,
                           transport.size), work, copied=True)


def inputs_at_root(transport: Transport, mine: Any, root: int, lands: Callable[[int], Any],
                   reads: Reads, into: Any | None = None,
                   copied: bool = False) -> list[Any] | None:
    """Every rank's flat `mine`, in rank order, at the root (None elsewhere, and where the
    root gives `into`: see `Transport.all_inputs`), from one exchange (which also carries
    the call's check): `reads`, what each rank takes of each input; `copied`, whether the
    root copies each whole (`Transport.copied_whole`: a gather's, not a reduce's). Counted
    as what the root takes: one message from each rank, the size of `lands(src)`, where
    src's lands."""
    transport.at("one-shot")
    if transport.rank == root:
        transport.unread()  # (none takes the root's)
    elif copied:
        transport.copied_whole()  # (the root copies ours whole: a gather's)
    inputs = transport.all_inputs(mine, counted=False, reads=reads,
                                  into=into if transport.rank == root else None)
    if transport.rank != root:
        transport.count(mine, root, None, None)
        return None
    for src in range(transport.size):
        if src != root:
            transport.count(None, None, lands(src), src)
    return inputs
