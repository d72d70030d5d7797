"""The slot protocol: ranks of one node copy, and reduce, straight out of each other's memory.

Every rank maps every other rank's memory (how depends on the memory kind: host shared memory
for shm, CUDA IPC for cuda_ipc). A rank writes only its own memory, and only reads its peers'.
Each rank's host region holds

    control   64-byte lines, one counter per line (a counter sharing a line with other
              writes bounces between cores; one straddling two lines could tear):
                barrier    barriers this rank has entered
                published  one-shot inputs this rank has published, and their sizes
                read       the last one-shot turn whose inputs, read in place, this rank
                           has read (its peers may then reuse theirs)
                consumed   one line per peer: segments this rank has taken from that peer
                slot j     one line per slot: which segment slot j holds (dst, seq), the
                           message's size, and where the message lies when it is not in
                           the slot: an address (and whether it is shared), or a
                           registered region and offset
                call a     one line per one-shot area: the call descriptor and the size of
                           the input published there, and its address when it is read in
                           place
                pair p t   two lines per peer, by turns: the six integers of a point-to-
                           point check for peer p (`say_pairs`), its number last
                share p    one line per peer: for a shared message from p, which one and
                           where it lands; for ours to p, which one's part has landed;
                           the last pair turn whose message from p, read in place, this
                           rank has read; for a shared (or pushed) input from p, the turn,
                           and where it lands and how much p writes; for ours to p, the
                           last turn whose part has landed;
                           last, how much of a shared message from p its sender writes
                push p     one line per peer: where p's forwarded result lands (posts made,
                           address, size); how many of ours to p have landed

and its data memory, in the host region too or on the device, holds

    slots     SLOTS buffers of `segment_bytes`: outgoing messages, one segment at a time
    one-shot  two areas of `one_shot_bytes` (a page at least), used by turns: every rank's
              input to one exchange (a small call, a call check: `_all_inputs`)

To send, a rank cuts the message into segments; for each it waits for a free slot, copies the
segment in, and writes the slot's line last. To receive segment `seq` from `src`, a rank waits
until one of src's slot lines names (itself, seq), then copies it, or reduces it
(`op(mine, slot, out=acc)`), straight out of src's slot into its own buffer, and counts it
consumed; the slot is free once that count has passed it. Sender and receiver work at once,
so a message of any size streams through SLOTS * segment_bytes per rank. Counters only grow:
nothing is reset between collectives. Publishing relies on one rank's stores becoming
visible to the others in program order, as on x86-64.

Direct reads. Where the memory kind can copy straight out of a peer's ordinary memory (host
memory, through the kernel's cross-memory attach), a message of DIRECT_BYTES or more that a rank
sends while it receives one (a ring step) takes one slot line and no slot data: the sender
writes the address of its own buffer in the line, the receiver copies it from there into place
in one system call (or, to reduce it, READ_PIECE_BYTES at a time through scratch that stays in
cache) and counts it consumed, and the sender returns only then, since its buffer is being read.
Every rank of a ring then makes one copy a step instead of two. A copy of middle size (more than
a segment, less than DIRECT_BYTES) goes by whichever road its sender has measured cheaper
lately, where every rank has a core (`Roads`); so does one that its receiver reduces (a ring
step of a reduce-scatter or an all-reduce), by roads of its own (`reduced_roads`: a reduction
out of the slots, against a read and its reduction). A message sent one way only is not read
this way: where every rank has a core, from SHARED_BYTES, it is shared instead (below), and
below that, or where ranks share cores, sender and receiver copy through the slots at once,
which measured faster than one core reading it all. (The receiver takes a direct message however
it was sent, so the choice is the sender's alone.) A message started by `isend` and left for its
receiver is read this way from DIRECT_BYTES up, and where ranks share cores from more than a
segment: streamed through the slots, it would hold its sender until the receiver runs.

Shared copies. Where every rank has a core of its own, a message of SHARED_BYTES or more
sent one way only (a broadcast's, a scatter's, a gather's) is moved by both ends at once: the
sender announces its address as for a direct read; the receiver says in its share line
where the message lands, and reads all but the first half; the sender writes that half
straight into the receiver's buffer (`process_vm_writev`), and says so (a receiver with work
of its own meanwhile, `recv_while`, asks for the whole, in the last word of its share line, and
makes its work while the sender writes). Two cores each copy half, where one read would copy
it all: measured on 2 ranks, an 8 or 16 MiB broadcast takes
about a fifth less time (docs/transports.md, "Shared memory"), and in a slow spell a 2 MiB
broadcast's or gather's message, where the slots had moved it, 0.43x or 0.65x the time
(SHARED_BYTES). Below DIRECT_BYTES a message is shared only while `Sharing` says so (in a fast spell
the slots' copies, in the caches, may win), and else goes through the slots, its copies into them
timed for `Sharing`. A receiver that reduces the message asks for no part, and reads it all.

Shared inputs. The one-shot exchange shares a copy the same way, on two ranks with a core each,
for inputs of SHARED_BYTES or more of a call that names what each rank takes (`reads`): an
owner that takes nothing (a broadcast's root, a gather's other rank) marks its address word
SHARED instead of copying its input into its area. Its reader, where it takes that whole input
into place (`into`: a broadcast's buffer, a gather's result), first asks, in its share line for
the owner, with the turn, where the input lands, and how much of it the owner is to write:
half, or ALONGSIDE_EIGHTHS eighths where the reader has work of its own to make meanwhile
(`alongside`: a gather's root copying its block). Then it publishes. Once both have published
and the lines agree, the owner writes that part there (`process_vm_writev`) and says so in its
share line, while the reader makes its work and reads the rest; the owner returns once the
reader has counted the turn read (the READ counter), as for any input read in place. A reader
that does not ask reads it all. Only an input that its reader copies whole is offered
(`copied_whole`: a broadcast's root's, a gather's other rank's, not a reduce's), and only while
`Sharing` says copies into the area cost too much now. Measured on 2 ranks in a slow spell
(docs/performance.md, "One-way copies shared by both ends"): a 1 MiB broadcast took 84-104 us where
through the areas it took 196-208 (MPICH's 125-143), a 1 MiB gather 81-83 against 103-120 (MPICH's
84-96). A gather's root that copied its own block after the exchange, reading half of its
peer's, took 79 us where that peer's write of its half ended at 57 (a timeline of one call);
copying its block meanwhile, with 5/8 written by the peer, 79 -> 72-75 us in the benchmark
(docs/performance.md, "Messages readied once"). On two ranks, the input of more than LEFT_BYTES of
an owner that takes its peer's whole input too (an all-reduce's), is left where it lies, its reader
reading it whole (`process_vm_readv`) while the owner reads the reader's; where an area holds it
and every rank has a core, only while that road costs less than the area's (`InputRoad`, as for
"Inputs read in place" below: on the third machine, where a read costs three to four times a
copy, a 1 MiB all-reduce took 125-145 us left in place and 66-77 through the areas). A
reduce's other rank, which takes nothing, puts its input in its area, or leaves it in place for
its root to read, by the road it measures cheaper (`LeftRoad`): in a slow spell its copy into
the area, into memory the root read in the call before, made a 1 MiB reduce take 440-449 us,
left in place 126-130; in a fast one the area wins.

Pushed inputs. On two ranks with a core each, an all-gather's inputs of PUSHED_BYTES or more
(each rank places its own block and takes its peer's whole input into place) may move the
other way: each rank asks, as a shared input's reader does, for the whole input (all but the
last bytes of a line, which it reads), and marks its own address word SHARED. Once the lines
agree, each copies its input into its own block of the result, then writes that block, still
in its caches, into its peer's result (`process_vm_writev`), and says so in its share line;
it returns once its peer's has landed and its peer has counted the turn read. A read fetches
the input from memory that the other core filled last; the write goes out of the writer's own
caches, and lands where the two results lie, whose distance within a page the two ranks' like
allocations often make a multiple of 32 where the input's and the result's are not
("Copies whose ends nearly alias" in docs/performance.md). But a write into memory that the
other core read last waits in a slow spell, as a forwarded result's does, so the two roads go
by `PushRoad`: each rank times the rest of the call from when both have come, on either road,
and votes; the blocks are written where both voted so. Where a rank's input lies in
registered memory, it is not written: its peer copies it out of its mapping.

Forwarded results. A ring all-reduce's last reduce-scatter step and its first all-gather
step (`reduce_forward`) are fused where direct reads are, every rank has a core, and every
chunk is of DIRECT_BYTES or more: each rank announces its outgoing chunk as for a direct read,
then posts in its push line where its left neighbour's result is to land. It reads the chunk
from its left a piece at a time, reduces each piece into place, and writes the piece
straight on into its right neighbour's posted buffer (`process_vm_writev`) while the piece is
still in cache. Without it the right neighbour would read the whole chunk back from memory
in a step of its own: measured on 2 ranks, a 16 MiB all-reduce of ordinary buffers takes
about a seventh less time (docs/transports.md, "Shared memory"). On two ranks with a core each,
chunks from REDUCED_DIRECT_BYTES to DIRECT_BYTES are fused too where both ranks measure it
cheaper (`ForwardRoad`): each posts with its vote, and the step is fused where both vote for
it. So is a reduce's step with its gather's message, the result going one way (the root's
peer writes; the root writes nothing, and its peer takes nothing back).

Registered memory. `register` hands out memory in a region of its own that every peer maps,
as MPI_Win_allocate_shared does. A message sent from there takes one slot line naming the
region and the offset, and the receiver copies, or reduces, straight out of the sender's
memory: no copy at all besides the one the collective is for. So do the one-shot inputs and
the pair messages read in place (below): where one lies in registered memory, the word that
says where holds its region and offset, marked REGISTERED, instead of its address, and the
reader copies it out of its own mapping of the owner's region. A direct read is a system call
that costs two to three times a copy a byte here; this is a copy (docs/performance.md, "Every
collective from registered buffers": 1.26x-2.93x MPICH's speed at 1 MiB on 2 ranks). So a one-shot
exchange that names what each rank takes (`reads`) leaves a registered input of
`references_from` or more (REFERENCE_BYTES, where every rank has a core) where it lies below
`reads_inputs_from` too, where it would otherwise copy it into its area, and its owner then
waits for its readers, as one read in place does; a pair's message from registered memory
of more than REGISTERED_PAIR_BYTES is read in place at any size.

A call of one exchange (a small all-reduce, a call check) instead publishes its whole input in
a one-shot area (`_all_inputs`), with its call descriptor beside it, and every rank reads every
other's: one publish and one wait both check the call and move its data (but for the inputs
that stay where they lie: "Shared inputs", "Inputs read in place"). An input that no peer
takes (`Transport.unread`: a broadcast's other ranks', a gather's or a reduce's root's) is not
copied: its area keeps what it held. Memory per rank, whatever the message: SLOTS *
segment_bytes + 2 * one_shot_bytes + the control lines (a page up to 11 ranks), and on the host
the pair areas (below). A wait spins briefly, then yields the CPU (`Transport.wait`), and stops
with PeerFailedError if the peer's process has died rather than wait out the timeout.

Inputs read in place. Through the areas, a one-shot exchange copies each rank's whole input
into its area, for its peers to copy what they take back out. Where the caller names what each
rank takes of each input (`reads`: its own block of each, in an all-to-all or a reduce-scatter;
every input whole, in an all-gather), and that is at least `reads_inputs_from` (where direct
reads work: DIRECT_INPUT_BYTES, or CROWDED_INPUT_BYTES where ranks outnumber cores), it copies
nothing instead: each rank writes the address of its input in its call line, and once the lines
have come and agree, reads what it takes of each peer's input straight out of the peer's
memory, into place where the caller says (`into`: the result of an all-to-all or an all-gather)
or into scratch, and copies its own part. It then counts the turn in its read line, and returns
once every peer's has counted it: they were reading its input. Read in place, an input need not
fit an area: an all-to-all or an all-gather then takes one exchange at any size
(`Transport.reads_in_place`), placing each block straight where it belongs, as the pairwise
exchange and the ring would, with one wait (a reduce-scatter's one exchange still fits an area,
into scratch). A read is a system call and, across cores, two to three times a copy's time a
byte here, so it pays where it saves more than a copy. Measured on 2 ranks (docs/performance.md,
"A second machine"): a 1 MiB all-gather took 133-174 us where through the areas it took 224-312,
a 2 MiB one 261-306 against 557-690; below 1 MiB, where the areas stay in the caches, the areas were
as fast or faster (an all-to-all of 256 KiB read in place took 56-64 us, against 49-52). Inputs
that one rank takes whole (a gather's root, a broadcast's others) or reduces (an all-reduce's)
also stayed faster through the areas, whose copies the writers share and whose readers work
straight out of them. Where ranks outnumber cores, each step of the pairwise exchange or the
ring waits for a peer to be scheduled, and one exchange pays that once: there inputs larger
than an area (`reads_inputs_above`) are read in place from CROWDED_INPUT_BYTES taken of each.
Measured on 4 ranks sharing 2 cores (`mpiexec -n 4 python -m benchmarks.all_to_all -b 256K -e
4M -f 4 -n 10 -w 2 --transport shm --compare mpi`, and the same all_gather): a 1 MiB all-to-all
took 538 us where the pairwise exchange took 1019 (MPICH's 327-402), a 4 MiB all-gather 2507
where the ring took 3262; on 3 ranks, 537 against 623, and 2245 against 3123. Every rank of a
call names alike what it takes, so all take the same exchange; the general path names the same
as the lane. Where every rank has a core, the inputs that the areas hold go by the road the
ranks measure cheaper (`InputRoad`: the areas where every rank's costs said so in the call
before, each voting in its published line): read in place as above, or copied into its owner's
area and out again by its readers, whose copies run out of the caches while the cores share
theirs (docs/performance.md, "Pair areas of a megabyte, and inputs through the areas by the
road measured cheaper": a 1 MiB all-to-all on 2 ranks from 0.82x-0.96x MPICH's speed to
1.16x-1.24x); a reader that places nothing (a reduce-scatter's) does not copy it out, but
works straight out of the area, as out of any one-shot exchange's. A reader takes each input
from where its owner's word says it lies, whatever its own road.

Folded checks. A call whose check is handed over (`check_first`) makes it in its first
exchange: the rank first publishes what fits in its free slots, then checks (every rank's call
descriptor through the one-shot lines, or the two ends of a message with one peer through their
pair lines, `say_pairs`), and only then takes its peers' data. Its copy in overlaps the wait
for the others instead of following a check made apart. On a mismatch no data has been taken:
each rank withdraws what it published, and raises. A rank whose message's check waits for a
peer that has published a one-shot turn it has not (the peer is in a collective call) publishes
that turn too, the check's six integers as its call line; the peer, seeing them, answers the
check with its call's descriptor (`_answer_collective`, `_answer_messages`). Both then raise,
having taken each other's turn, so the next call of each lines up.

Pair areas. A sendrecv with one peer of up to a pair area each way, with its check (by a
step readied once per kind of message, `prepare_pair_message`), is one publish and one wait, as
a one-shot exchange is: each rank copies its data into its area for that peer (two per peer, by
the parity of the pair's turn), writes the check's six integers in its pair line, marked
INLINE, and once the peer's line has come compares the words and copies the peer's data out of
the peer's area for it. A turn's area is written again two turns later, once the peer has said
the turn between, which it says only after it has read this one. A send or a recv alone of up
to a pair area and a segment goes the same way, one end's area unused, and so does a sendrecv
with two peers (a ring shift: `prepare_ring_message`), as a send alone to one and a recv alone
from the other, both published before either is waited for. A peer whose words are
not marked (its message goes the general way: a traced rank, or a larger send alone) takes from
the slots after its check, so the rank then sends through a slot, and takes the peer's from one,
as the general way does. On host memory (the CUDA transport's data goes the general way). Memory per
rank: two pair areas per peer (`pair_area_bytes`: 1 MiB on 2 ranks, less on more, so that a
rank's stay within 2 MiB, but 16 KiB at least), touched only by the messages that use them.
Measured on 2 ranks (docs/performance.md, "Middle sizes"), a 32 KiB sendrecv took 35-36 us read in
place and 22 through an area, 128 KiB 52 against 32, 512 KiB 120-127 against 74-85; 1 MiB 220-224
against 389-391, out of the caches. (Measured before, when a direct read cost less here, 64
KiB went alike either way, and the areas held 16 KiB.) Those copies win while the two cores
share their caches, and lose by as much in a slow spell, where reads in place win (as "Pair
messages read in place" says). So where direct reads work and every rank has a core, a kind
of sendrecv of PAIR_ROADS_FROM or more each way goes by the road that costs less lately, read
in place as the next paragraph says, or through the areas: each rank times its moves in one
call of a few, and the pair agrees on the road in its words (`PairRoad`).

Pair messages read in place. A checked sendrecv with one peer of more than a pair area each
way (`prepare_pair_message`, `pair_message`), where direct reads work and every rank has a
core, is read in place: each rank writes the address of its data in the last word of its pair
line, its words marked IN_PLACE; once the peer's line has come and agrees, it reads the peer's
data straight into its own buffer, says so in its share line for the peer, and returns once the
peer has said the same (it was reading ours). One copy each way, no slot, two waits. A peer on
the general way is met there: once the check agrees, both messages move as that way moves them
(`_sendrecv`). Measured on 2 ranks (docs/performance.md, "A second machine"), a 1 MiB sendrecv took
241-247 us where the slots took 409-451 (MPICH's 177-180, one direct read each way too). At 64 and
256 KiB the slots, in the caches, were then as fast or faster; once the steps were readied
(`prepare_pair_message`), in a slow spell, read in place took 23.3 against 36.4 us at 8 KiB,
26.7 against 43.3 at 32 KiB, 38.7 against 70.2 at 128 KiB, 55.3 against 106.3 at 256 KiB, so
they are read in place above the pair areas. A sendrecv with two peers (a ring shift,
`prepare_ring_message`) is read in place from the same size too, each half on its own: the
rank leaves its message in place for one peer and reads the other's, both published before
either is waited for, and waits for its own to be read only after it has read, so no rank of
the ring waits on one that waits on it; but where its next rank takes its message the general
way (a pipeline), it sends first (`ring_step`). Where ranks outnumber the cores, pairs and
rings are read in place from CROWDED_DIRECT_BYTES, where the general way reads directly too:
one publish carries the words and the address, where the general way checks first and
announces after. Measured on 3 and 4 ranks sharing 2 cores (docs/performance.md, "Ring shifts
read in place"), a 1 MiB ring shift ran at 0.79x-0.89x MPICH's speed in the same job on 3 ranks
where the general way ran at 0.51x-0.60x, and at 0.65x-0.76x against 0.50x-0.57x on 4.

Crowded ring shifts. Where ranks outnumber the cores, a ring shift's send of PAIR_ROADS_FROM up
to a pair area goes through the area while the rank's copies into its areas cost at most
SendRoad.SLOW a byte, and is left in place for its receiver to read while they cost more
(`SendRoad`, one per kind of send: now and then it copies into the area all the same, so
that the cost stays known). Its copies are timed in the rank's CPU time, not the clock's: a
rank that shares a core loses it in the middle of a copy, which the clock would count. The
receiver takes the message from wherever the sender's mark says (`_take_pair`), so each sender
chooses alone. On the third machine copies into memory that a peer on the other core last read
swing with the machine, from job to job: a 256 KiB copy into a pair area took 7.5 us of CPU in
one job and 81-112 in the next, and 3 ranks' 256 KiB ring shift 59-64 us against 250-265
(docs/performance.md, "Crowded ring shifts by the cost of their copies").

Sends alone. Where every rank has a core, a send with no recv beside it of PAIR_ROADS_FROM up
to a pair area and a segment goes the same way, by its own `SendRoad`, at SEND_SLOW a byte: in
the slow spells a copy into an area that the receiver read last costs several times a read of
the sender's buffer, and a 256 KiB send and its recv took 279-281 us a round trip through the
area, 76-77 by the road (MPICH's `Send` and `Recv` 46-54 in such spells). In the fast ones the
road keeps the area, as before.

One-sided moves. Where direct reads work, a collective may move blocks itself (`locate`,
`get`): an exchange carries where a buffer lies (its address word, as for inputs read in
place: in registered memory a region and offset, copied out of the reader's own mapping), and
a peer reads straight out of it; a barrier then says every read has ended. A scatter moves
its blocks so (collectives/scatter.py), and a broadcast on ranks that share cores its buffer
(collectives/broadcast.py): no slot line is announced, found and answered per block or
segment.

The protocol is the same whatever memory the data lives in; a memory kind (`MemoryKind`) says
where, and how to copy and reduce there. The control lines always stay in host shared memory,
where the CPU polls them.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import time
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy
from mpi4py import MPI

from .base import (CALL_WORDS, GENERAL_WAY, MESSAGES, READIED, SILENT, Exchange, Half, Heard,
                   Moved, Reads, ReduceOp, Transport, buffer_address, call_line, kept,
                   result_phase, ring_kinds, ring_step, swapped_dtypes)
from .bootstrap import duplicated, on_one_node, start
from .errors import CollectiveError, InvalidArgumentError, MismatchError, PeerFailedError
from .shared_memory import (SHM_DIR, free_bytes, half_a_page_from, read_peer_bytes,
                            share_regions, write_peer_bytes)

LINE = 64  # bytes: a cache line, one counter each
PAIR_WORDS = struct.Struct("=6Q")  # a pair line's six integers, after its turn
PAGE = 4096
SLOTS = 4  # a sender fills some slots while its receiver empties others
WORDS = LINE // 8  # 8-byte words per line
# Messages of at least this size go by direct reads (or shared copies), where the memory kind
# allows (see "Direct reads"): below it, measured, copies through the slots, which stay in the
# caches, mostly cost less, and middle-sized ones take the road measured cheaper (`Roads`).
DIRECT_BYTES = 4 << 20
# Where ranks outnumber the cores, copies sent while receiving one go by direct read from
# this size: there no road is measured (`Roads`), and the slots, of more ranks than cores, no
# longer stay in the caches. Measured on 4 ranks sharing 2 cores (docs/performance.md, "Large calls
# in the lane, and copies read directly on shared cores"), a sendrecv around the ring of 1 MiB
# took 491-513 us so against 798-816 through the slots, of 2 MiB 805-1012 against 1762-1808,
# of 512 KiB 362-367 against 403-496; of 256 KiB it took longer (365 against 246). Reduced
# messages stay as they were: an 8 MiB reduce-scatter, its 2 MiB ring steps read so, took
# 4365-4675 us against 3913-4197.
CROWDED_DIRECT_BYTES = 512 << 10
# A message that its receiver reduces, sent one way (a scan's, a reduce's: `_send_reduced`), may
# be read directly from this size up where every rank has a core (`reduced_sends`, below). (A
# ring step's, sent while receiving one, was read directly from this size too: measured on 2
# ranks (docs/performance.md, "Reduced messages read directly from 512 KiB"), a 2 MiB
# reduce-scatter took 248-299 us where its 1 MiB chunk through the slots took 407-410, each 256
# KiB copy into a slot running some 50 us. It now goes by the road measured cheaper,
# `reduced_roads`: on the third machine the slots won, "Reduced ring steps by the road measured
# cheaper".)
REDUCED_DIRECT_BYTES = 512 << 10
# A message sent one way that its receiver reduces (a scan's, a reduce's) goes through the slots,
# its sender copying while its receiver reduces, unless those copies cost more than this a byte:
# then its receiver reads it directly and reduces it alone. On the third machine a 16 MiB scan's
# copies into the slots cost 75-125 ps a byte in some jobs and 357-452 in others (copies into
# memory the other core read last), where the scan took 2.4-3.4 ms, and 8.7-9.2 through the
# slots; read directly in those, 3.6-4.5 (docs/performance.md, "Crowded ring shifts by the
# cost of their copies").
REDUCED_SLOW = 250e-12
# A send alone where every rank has a core (see "Sends alone") is left in place while its
# sender's copies into its pair area cost more than this a byte, in CPU time. In a ping-pong of
# 64-256 KiB on 2 ranks, each road pinned in turn within each job (docs/performance.md, "Sends
# alone left in place"), those copies cost 72-250 ps a byte in the jobs of the fast spells,
# where the area won at 64 KiB and the two roads were within a fifth, either way, at 128 and
# 256 KiB, and 366-589 in the slow ones, where through the area a round trip took 88-100,
# 161-172 and 279-281 us, left in place 38-43, 48 and 60-70.
SEND_SLOW = 250e-12
# A direct read that is reduced goes through scratch this much at a time: fewer system calls,
# each pinning the peer's pages, while a piece stays in the caches to be reduced. Measured on
# 2 ranks, a 16 MiB all-reduce alternating the forwarded step ("Forwarded results") with the
# two steps in one job: pieces of 256 KiB made it 1.01x-1.05x faster, 512 KiB 1.07x, 1 MiB
# 1.09x (twice), 2 MiB 1.05x.
READ_PIECE_BYTES = 1 << 20
# The first control lines: three counters, then one per peer (consumed); the slot, call,
# pair, share and push lines follow (the module's docstring, and `_setup`).
BARRIER, PUBLISHED, READ, CONSUMED = 0, 1, 2, 3
# In the published line, after its counter: a rank's vote in its one-shot exchange of each
# turn's parity, for its kind's next call by the first of its two roads (`VotedRoad`).
VOTES = PUBLISHED * WORDS + 1
# One-shot inputs of which each rank takes at least this much are read in place (see "Inputs
# read in place"), where direct reads work: where every rank has a core, and where ranks
# outnumber cores (CROWDED_INPUT_BYTES).
DIRECT_INPUT_BYTES = 512 << 10
CROWDED_INPUT_BYTES = 256 << 10
KEPT_EXCHANGES = 64  # one-shot exchanges kept, one per (shape, dtype) seen (and reads)
# A pair's messages up to a pair area each way go through the pair areas (see "Pair areas"),
# two per peer: of PAIR_AREA_MOST, or less where a rank's would not fit PAIR_AREAS_BYTES in all,
# but never less than PAIR_AREA_LEAST (`pair_area_bytes`). On 2 ranks, 1 MiB: a 1 MiB sendrecv
# took 58-64 us through them where read in place it took 91-99, on a machine whose cores share
# an L3 (docs/performance.md, "Pair areas of a megabyte, ..."); `PairRoad` still reads in place
# where its reads cost less.
PAIR_AREA_MOST = 1 << 20
PAIR_AREAS_BYTES = 2 << 20
PAIR_AREA_LEAST = 16 << 10
# A sendrecv's messages from here up to a pair area each way go by the road measured cheaper
# lately, through the pair areas or read in place (`PairRoad`; see "Pair areas").
PAIR_ROADS_FROM = 64 << 10
# A pair's message from registered memory of more than this is read in place, out of the
# peer's mapping (see "Registered memory").
REGISTERED_PAIR_BYTES = 16 << 10
INLINE = 1 << 61  # marks a pair line's first word: the message lies in the sender's pair area
IN_PLACE = 1 << 60  # marks it: the message lies at the address in the line's last word
# ... and, with either, may say that its sender's reads in place cost less lately (`PairRoad`)
PREFERS_READ = 1 << 59
MARKS = INLINE | IN_PLACE | PREFERS_READ
# An address word (a one-shot input's, or a pair message's, read in place) marked so says that
# the data lies in registered memory: region << OFFSET_BITS | offset, which a peer copies out
# of its own mapping of the owner's region (see "Registered memory").
REGISTERED = 1 << 62
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
# A one-shot exchange of inputs of this size or more that names what each rank takes reads
# those in registered memory where they lie. Below it, copying one into an area costs less
# than the wait for its readers: on 2 ranks, a gather of 128 KiB blocks so took 47-51 us,
# against 27-29 through the areas (`benchmarks.gather -b 256K -e 1M -f 2 --registered 1`).
REFERENCE_BYTES = 256 << 10
# Messages sent one way, and one-shot inputs taken one way on two ranks, of this size or more
# are shared where every rank has a core: their sender writes half into the receiver's buffer
# while the receiver reads the rest (see "Shared copies", "Shared inputs"). Measured on 2
# ranks in a slow spell (docs/performance.md, "One-way copies shared by both ends"), a 2 MiB
# broadcast's message took 212-228 us shared, 498-530 through the slots (MPICH's 236-308), a 2 MiB
# gather's 130-144 against 206-216 (MPICH's 163-200).
SHARED_BYTES = 512 << 10
# An address word marked so (an ordinary address: below 2**47) says that its owner takes
# nothing in the exchange, and writes the first part of its input (half, or
# ALONGSIDE_EIGHTHS eighths) into its reader's buffer if the reader asks (see "Shared
# inputs"); or, an all-gather's, that its owner writes it all so (see "Pushed inputs").
SHARED = 1 << 61
# A shared input's reader asks for this many eighths of it from its owner where the reader
# has work of its own to make meanwhile (`alongside`: a gather's root copying its block),
# else for half. Its landing word says how many, above the address (LANDING_BITS).
ALONGSIDE_EIGHTHS = 5
LANDING_BITS = 56
# On two ranks with a core each, a one-shot input of more than this whose owner takes its
# peer's whole input too (an all-reduce's) is left where it lies and read directly (see "Shared
# inputs"): measured with 1 MiB all-reduces, 274-296 us against 318-341 through the areas in a
# fast spell, 221-253 against 307-314 in a slow one; with 512 KiB ones the areas, which then
# fit a core's cache, won in the fast spell (72-79 us against 111-122) and lost in the slow
# one. Where an area holds it, it goes by the road the ranks measure cheaper (`InputRoad`):
# on the third machine the areas won at 1 MiB too.
LEFT_BYTES = 512 << 10
# On two ranks with a core each, an all-gather's inputs of this size or more may be written by
# their owners into their peers' results, by the road both ranks measure cheaper (`PushRoad`,
# see "Pushed inputs").
PUSHED_BYTES = 2 << 20


class MemoryKind(Protocol):
    """Where the slots and one-shot areas live, and how data is moved there."""

    xp: Any  # the array module of the data: numpy or cupy
    device: str  # "cpu" or "cuda", as in `collectives.init`
    in_host_region: bool  # True: the data lives in the host regions, after the control lines

    def share(self, comm: MPI.Comm, regions: list[Any], offset: int,
              nbytes: int) -> list[Any]:
        """Every rank's data memory of `nbytes`, flat bytes in rank order. Collective."""

    def copy(self, dst: Any, src: Any) -> None:
        """dst[...] = src, complete when it returns."""

    def reduce(self, op: ReduceOp, out: Any, mine: Any, theirs: Any) -> None:
        """out = op(mine, theirs), complete when it returns."""

    def settle(self) -> None:
        """Wait for every earlier read of a peer's memory to finish."""

    def can_read(self, comm: MPI.Comm, pids: list[int], usable: bool) -> bool:
        """Whether `read` and `write` can copy straight out of, and into, any peer's buffer, on
        every rank. Collective."""

    def read(self, pid: int, address: int, into: Any) -> None:
        """into[...] = the bytes at `address` in process `pid` (only used if `can_read`)."""

    def write(self, pid: int, address: int, data: Any) -> None:
        """The bytes at `address` in process `pid` = data (only used if `can_read`)."""


# Buffers that a peer may still write into (a shared message's receiver gave up waiting for the
# sender's part): kept until exit, so that a late write never lands in reused memory.
_LENT: list[Any] = []


def pair_area_bytes(size: int) -> int:
    """The bytes of each pair area on `size` ranks (see "Pair areas"): PAIR_AREA_MOST, or less,
    in pages, where a rank's 2 * (size - 1) would not fit PAIR_AREAS_BYTES; PAIR_AREA_LEAST at
    least."""
    fits = PAIR_AREAS_BYTES // max(1, 2 * (size - 1)) // PAGE * PAGE
    return max(PAIR_AREA_LEAST, min(PAIR_AREA_MOST, fits))


def _sender_part(nbytes: int, eighths: int = 4) -> int:
    """Of a shared message or input of `nbytes`, the bytes the sender writes (the first ones):
    half, or `eighths` eighths, in whole cache lines."""
    return nbytes * eighths // 8 // LINE * LINE


def _alive(pid: int, thorough: bool = False) -> bool:
    """Whether process `pid` is alive. `thorough` also reads its state, since a process that
    died and that its parent has not reaped yet (a zombie) still takes signals."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if thorough:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                return stat.read().rpartition(b")")[2].split()[0] != b"Z"
        except (OSError, IndexError):
            pass
    return True


def folded(old: float | None, value: float, times: int, warm: int, weight: float,
           outlier: float) -> float:
    """A measured cost with its `times`-th `value` folded in: the least of the first `warm`
    (the first moves run cold), then a running mean giving the newest `weight`, a value
    counting for at most `outlier` times the mean (a move the scheduler interrupted cannot
    hold a road shut). What `Roads`, `PairRoad`, `Sharing` and `InputRoad` keep."""
    if old is None:
        return value
    if times <= warm:
        return min(old, value)
    return old + weight * (min(value, outlier * old) - old)


class Roads:
    """Which road a middle-sized message takes: through the slots, or by a direct read.

    Between a segment and DIRECT_BYTES neither road always wins on one machine. The slots'
    two copies run out of the caches, and win while the two cores share theirs; where they
    do not (cores on different L3 caches, a busy neighbour), the one copy of a direct read
    wins (docs/transports.md, "Shared memory"). So each rank times its own copies of such messages
    and sends the next one by the road that has cost it less per byte lately: through the
    slots, its copies into slots plus its copies out of a peer's; by direct read, a read of
    a peer's buffer, which must cost less by a margin (DIRECT_MARGIN). Where the two cost
    about the same, each rank of a pair would otherwise flip between them on its own, and a
    pair whose ranks chose differently waits: the one taking the slots' segments for the
    other to finish its read.

    A cost is per call: the slots' copies of a message are timed a segment at a time (the
    waits between them are not copying) and summed (`timed`, then `settle`). A rank first
    takes the slots, then direct reads, for WARM calls each, and starts each cost at the
    least it saw there: the first calls run cold (measured on 2 ranks at 1 MiB, the first
    copies into slots cost 8x, the first reads 1.3x, what they cost later), and a mean of
    them held a rank on the dearer road for as long as a benchmark runs. After that, once
    every EXPLORE_SECONDS a message takes the other road, so that its cost stays known (a
    road taken more often slowed a tight loop of calls by 5-8%). The slots' copies are timed
    in one call of SAMPLE, and in every call while the direct reads are preferred (then the
    slots are the road being explored); one time counts for at most OUTLIER times the
    running mean, so that a copy the scheduler interrupted cannot hold a road shut. Only
    copies sent while receiving one (a ring step, a sendrecv, an all-to-all step) are timed
    and chosen for: there every rank does the same work as its peer. (The receiver takes a
    message however it came, so each sender may choose alone.) A transport keeps one for
    copies and one for messages their receivers reduce (`reduced_roads`), whose "out" is a
    reduction out of the slots and whose "read" a read with its reduction.
    """

    EXPLORE_SECONDS = 0.1
    DIRECT_MARGIN = 0.75  # a direct read goes while it costs under 0.75x the slots' copies
    WEIGHT = 0.25  # of the newest time in each running mean
    SAMPLE = 16  # the slots' copies are timed in one call of this many
    OUTLIER = 4
    WARM = 8  # calls timed on each road before the roads are compared

    def __init__(self) -> None:
        self.cost: dict[str, float | None] = {"in": None, "out": None, "read": None}
        self.times = {"in": 0, "out": 0, "read": 0}  # how many calls went into each cost
        self.explored = time.monotonic()  # when a message last took the road not chosen
        self.calls = 0  # calls that could time the slots' copies (`sample`)
        self.prefers_direct = False  # what the costs said last
        self._spent = {"in": 0.0, "out": 0.0}  # this call's slot copies so far: seconds,
        self._moved = {"in": 0, "out": 0}  # and bytes

    def direct(self) -> bool:
        """The road of the next middle-sized message: True for a direct read. The slots until
        both their copies are timed in WARM calls, then direct reads until they are, then the
        cheaper road."""
        if self._warming("in", "out"):
            return False
        if self._warming("read"):
            return True
        into_slot, out_of_slot, read = self.cost["in"], self.cost["out"], self.cost["read"]
        self.prefers_direct = cheaper = read < self.DIRECT_MARGIN * (into_slot + out_of_slot)
        now = time.monotonic()
        if now - self.explored < self.EXPLORE_SECONDS:
            return cheaper
        self.explored = now
        return not cheaper

    def sample(self) -> bool:
        """Whether this call times the slots' copies (a direct read is always timed: one
        clock reading a message, where the slots take two a segment)."""
        self.calls += 1
        sampled = self.prefers_direct or self.calls % self.SAMPLE == 0 \
            or self._warming("in", "out")
        if sampled:  # (what a call that raised midway had timed is not this call's)
            self._spent, self._moved = {"in": 0.0, "out": 0.0}, {"in": 0, "out": 0}
        return sampled

    def _warming(self, *kinds: str) -> bool:
        """Whether any of these costs has fewer than WARM calls in it."""
        return any(self.times[kind] < self.WARM for kind in kinds)

    def took(self, kind: str, seconds: float, nbytes: int) -> None:
        """Fold one call's `seconds` spent on `nbytes` of `kind` ("in", "out" or "read") into
        its cost: the least while warming up, then a running mean."""
        self.times[kind] += 1
        self.cost[kind] = folded(self.cost[kind], seconds / nbytes, self.times[kind], self.WARM,
                                 self.WEIGHT, self.OUTLIER)

    def timed(self, kind: str, move: Callable[..., None]) -> Callable[..., None]:
        """`move(piece, ...)`, its time and the bytes of `piece` (flat bytes) added to this
        call's `kind` ("in" or "out"), for `settle`."""
        def timed_move(piece: Any, *rest: Any) -> None:
            started = time.perf_counter()
            move(piece, *rest)
            self.spend(kind, time.perf_counter() - started, piece.size)
        return timed_move

    def spend(self, kind: str, seconds: float, nbytes: int) -> None:
        """Add `seconds` spent on `nbytes` to this call's `kind` ("in" or "out"), for
        `settle`."""
        self._spent[kind] += seconds
        self._moved[kind] += nbytes

    def settle(self) -> None:
        """Fold the slots' copies timed in the call just made into their costs."""
        for kind, nbytes in self._moved.items():
            if nbytes:
                self.took(kind, self._spent[kind], nbytes)
                self._spent[kind], self._moved[kind] = 0.0, 0


class PairRoad:
    """Which road one kind of sendrecv with a peer takes, of PAIR_ROADS_FROM up to a pair area
    each way: through the pair areas, or read in place (see "Pair areas").

    Neither always wins on one machine, as for `Roads`: the areas' two copies run out of the
    caches and win while the two cores share theirs; where they do not, one direct read wins
    (docs/performance.md, "Pair messages by the road measured cheaper"). So each rank times its
    own moves of the kind's messages in one call of SAMPLE: through the areas, its copy into its
    area and its copy out of the peer's; in place, its read of the peer's buffer (a kind has one
    size: times, not times a byte). Each cost starts at the least of WARM calls, then is a
    running mean, a time counting for at most OUTLIER times the mean.

    Both ranks of the pair must take the same road: where they differ, each message still
    moves, but by the slower Python of `_take_pair`, and measured so, a 128 KiB sendrecv took
    79 us where both ranks' roads took 52. So the road is agreed: each rank says in its words
    (PREFERS_READ) whether its reads cost under MARGIN times its copies, and the next call of
    the kind reads in place where either rank said so (the slower rank sets the pace of
    both). The calls of a kind are numbered alike on both ranks, and the number alone picks
    the calls that are timed, the first WARM calls through the areas and the next WARM read in
    place, and, once in EXPLORE timed calls, RUN calls on the other road, the last one timed,
    so that its cost stays known (the first read after a run through the areas cost a 128 KiB
    sendrecv's reads 82-87 us where a run of reads took 32-33 a call). A call that is not
    timed costs a count (`Roads`' choice of every call cost a 32 KiB sendrecv a tenth of its
    time).
    """

    SAMPLE = 16
    WARM = 4
    EXPLORE = 16
    RUN = 2
    MARGIN = 0.75
    WEIGHT = 0.25
    OUTLIER = 4

    def __init__(self) -> None:
        self.cost: dict[int, float | None] = {INLINE: None, IN_PLACE: None}
        self.times = {INLINE: 0, IN_PLACE: 0}  # timed calls on each road
        self.call = (INLINE, MESSAGES | INLINE, False)  # the call under way, as `next` says
        self.copied = 0.0  # the timed call's copy into the area, seconds
        self.prefers_read = False  # what this rank's costs say, lately
        self._said = False  # what this rank said in the call under way
        self._agreed = self.call  # the next call's, unless timed (`heard`)
        self._calls = 0

    def next(self) -> tuple[int, int, bool]:
        """The next call (`call`): its road (INLINE or IN_PLACE), the first word that marks
        it, and whether it is timed."""
        self._calls = calls = self._calls + 1
        left = -calls % (self.SAMPLE * self.EXPLORE)  # calls until the next one explored
        if calls % self.SAMPLE and left >= self.RUN and calls > 2 * self.WARM:
            self.call = call = self._agreed
            return call
        if calls <= 2 * self.WARM:
            road = INLINE if calls <= self.WARM else IN_PLACE
        else:
            road = self._agreed[0]
            if left < self.RUN:
                road = INLINE if road == IN_PLACE else IN_PLACE
        self.call = call = (road, MESSAGES | road, calls % self.SAMPLE == 0 or left == 0
                            or calls <= 2 * self.WARM)
        return call

    def say(self) -> int:
        """The mark of this rank's words in the call under way: PREFERS_READ, or 0."""
        self._said = said = self.prefers_read
        return PREFERS_READ if said else 0

    def heard(self, word: int) -> None:
        """The peer's first word in the call under way: the next call's road is agreed."""
        road = IN_PLACE if self._said or word & PREFERS_READ else INLINE
        self._agreed = (road, MESSAGES | road, False)

    def took(self, road: int, seconds: float) -> None:
        """Fold a timed call's `seconds` on `road` into its cost."""
        self.times[road] += 1
        self.cost[road] = folded(self.cost[road], seconds, self.times[road], self.WARM,
                                 self.WEIGHT, self.OUTLIER)
        copies, read = self.cost[INLINE], self.cost[IN_PLACE]
        self.prefers_read = copies is not None and read is not None \
            and read < self.MARGIN * copies


class Sharing:
    """Whether an owner that may share its one-shot input shares it now, or copies it into its
    area as a smaller one goes (see "Shared inputs"); and whether a one-way message below
    DIRECT_BYTES is shared, or goes through the slots (see "Shared copies").

    Neither way always wins on one machine. Through the area, the owner copies the input in and
    its reader copies it out; those copies run out of the caches and win while the two cores
    share theirs: measured on 2 ranks, alternating with a commit that always took the areas
    (docs/performance.md, "One-way copies shared by both ends"), a 1 MiB broadcast took 60-66 us
    through them in a fast spell, where always shared it took 92-100. In a slow spell, a copy into
    memory that a peer last read costs several times a local copy (the owner's copy in took
    170-220 ps a byte, against about 50 in a fast spell), and sharing wins: 196-211 us
    through the areas, 84-104 shared. So the owner times its copies into its area, and shares
    while they cost more than SLOW a byte (and a sender, its copies into its slots; a `Sharing`
    made with another bound, `reduced_sends`, shares above that). Once every
    EXPLORE_SECONDS it copies into its area all the same, so that the cost stays known. It
    starts through the area, for WARM calls, from the least it saw there (the first copies run
    cold), then keeps a running mean of what the copies cost, each time counted for at most
    OUTLIER times the mean.
    """

    SLOW = 120e-12  # seconds a byte: a copy of 1 MiB into the area in 126 us or more
    EXPLORE_SECONDS = 0.1
    WARM = 4
    WEIGHT = 0.5  # of the newest time in the running mean
    OUTLIER = 4

    def __init__(self, slow: float = SLOW) -> None:
        self.slow = slow  # SLOW, or another bound for another kind of copy
        self.cost: float | None = None  # seconds a byte of a copy into the area, lately
        self.times = 0  # copies timed
        self.explored = time.monotonic()  # when an input last went through the area

    def shares(self) -> bool:
        """Whether the next input or message that may be shared is: not while warming up, nor
        once every EXPLORE_SECONDS; else while copies into the area cost more than SLOW a
        byte."""
        if self.times < self.WARM or self.cost is None or self.cost <= self.slow:
            return False
        now = time.monotonic()
        if now - self.explored < self.EXPLORE_SECONDS:
            return True
        self.explored = now
        return False

    def took(self, seconds: float, nbytes: int) -> None:
        """Fold a copy of `nbytes` into this rank's memory for a peer to read (its area, or its
        slots), which took `seconds`, into the cost."""
        self.times += 1
        self.cost = folded(self.cost, seconds / nbytes, self.times, self.WARM, self.WEIGHT,
                           self.OUTLIER)


class SendRoad:
    """Whether a send alone goes through the pair area, or is left in place for its receiver
    to read: a ring shift's on ranks that share cores (see "Crowded ring shifts"), or one with no
    recv beside it where every rank has a core (see "Sends alone").

    Through the area it costs the sender a copy, which runs out of the caches or, where the
    receiver on the other core read the area last and the machine is in a slow spell, at ten
    times that. So the sender times its copies into its areas in CPU time, and leaves its sends
    in place while they cost more than `slow` a byte (SLOW where ranks share cores, SEND_SLOW
    where each has one). It starts through the areas, for WARM timed calls, from the least it
    saw there (the first copies, and the first after a while in place, run cold), then keeps a
    running mean, each time counted for at most OUTLIER times the mean; it times one call of
    SAMPLE through the areas. While in place, once in EXPLORE calls it goes through the areas
    for RUN calls, the last one timed, so that the cost stays known.
    """

    SLOW = Sharing.SLOW
    WARM = 16
    SAMPLE = 8
    EXPLORE = 256
    RUN = 3
    WEIGHT = 0.5
    OUTLIER = 4

    def __init__(self, slow: float = SLOW) -> None:
        self.slow = slow
        self.cost: float | None = None  # seconds of CPU a byte of a copy into the area, lately
        self.times = 0  # copies timed
        self.calls = 0

    def next(self) -> tuple[bool, bool]:
        """The next send: whether it is left in place, and whether its copy (through the
        area) is timed."""
        self.calls = calls = self.calls + 1
        if self.times < self.WARM:
            return False, True
        if self.cost <= self.slow:
            return False, calls % self.SAMPLE == 0
        left = -calls % self.EXPLORE  # calls until the next run through the areas ends
        return left >= self.RUN, left == 0

    def took(self, seconds: float, nbytes: int) -> None:
        """Fold a timed copy of `nbytes` into the area, which took `seconds` of CPU."""
        self.times += 1
        self.cost = folded(self.cost, seconds / nbytes, self.times, self.WARM, self.WEIGHT,
                           self.OUTLIER)


class NumberedRoad:
    """Which of two roads the calls of one kind take, where every rank numbers those calls alike
    and takes each by the same road. Each rank times its moves on each road, a byte each (`took`,
    `folded`), and the number of the call alone chooses the explored calls: the first WARM take
    the first road, the next WARM the second, and once in EXPLORE calls a run of RUN takes the
    road the costs do not prefer, so that its cost stays known; before that, so does a run from
    each power of two from 4 * WARM, so that a cost the warm-up measured in another moment
    holds for a few calls, not for EXPLORE. (A 1 MiB all-to-all's copies into the areas, timed
    at 96-101 picoseconds a byte in one run's warm-up, took 26-32 once taken again; in 5 of 14
    runs of 1500 calls on 2 ranks, the road chosen on the warm-up's costs held to call 512,
    calls 9 to 350 taking 85-112 us on average where a call through both areas took about 50.)
    So the ranks explore together, and each measures the road it explores.

    Exploring is dear where the roads are far apart: in a slow spell a 1 MiB all-to-all took
    68 us a call in place and 200-900 through the areas (`InputRoad`), so a run of RUN in 64
    calls added about 7 us to every call's mean (docs/performance.md, "Roads explored less
    often"). Once in EXPLORE = 512 calls costs about 1 us, and at these sizes 512 calls take
    well under a second, where spells last minutes; the five runs before call 512 cost ten
    calls on the dearer road once, for each kind.
    """

    WARM = 4
    EXPLORE = 512
    RUN = 2
    WEIGHT = 0.25
    OUTLIER = 4

    def __init__(self, *kinds: str) -> None:
        self.cost: dict[str, float | None] = dict.fromkeys(kinds)
        self.times = dict.fromkeys(kinds, 0)  # how many calls went into each cost
        self.calls = 0

    def _first(self, cheaper: Callable[[], bool]) -> bool:
        """Whether the next call takes the first road; `cheaper` says whether the costs prefer
        it (asked once both roads are warm)."""
        self.calls = calls = self.calls + 1
        if calls <= 2 * self.WARM:
            return calls <= self.WARM
        period = min(self.EXPLORE, 1 << calls.bit_length() - 1)  # (a power of two, to EXPLORE)
        return cheaper() != (period >= 4 * self.WARM and calls % period < self.RUN)

    def took(self, kind: str, seconds: float, nbytes: int) -> None:
        """Fold `seconds` spent on `nbytes` of `kind` into its cost."""
        self.times[kind] += 1
        self.cost[kind] = folded(self.cost[kind], seconds / nbytes, self.times[kind], self.WARM,
                                 self.WEIGHT, self.OUTLIER)


class VotedRoad(NumberedRoad):
    """A `NumberedRoad` whose ranks each vote in every call for the road their own costs say is
    cheaper (in their published lines, VOTES), and whose next call takes the first road only
    where every rank voted so (`heard`): where each rank chose alone, ranks on different roads
    made each other wait (`InputRoad`)."""

    def __init__(self, *kinds: str) -> None:
        super().__init__(*kinds)
        self.agreed = False  # the last call's votes: True, all for the first road

    def takes_first(self) -> bool:
        """The road of every rank in the next call: True the first."""
        return self._first(lambda: self.agreed)

    def heard(self, votes: Iterable[int]) -> None:
        """Every rank's vote in this call (its own among them): the next call's road."""
        self.agreed = all(votes)


class InputRoad(VotedRoad):
    """Whether an input of one kind of one-shot exchange read in place (an all-to-all's, an
    all-gather's, a reduce-scatter's, of DIRECT_INPUT_BYTES or more taken of each, see "Inputs
    read in place") goes through its owner's area instead, where an area holds it.

    Neither road always wins on one machine, as for `Roads`: through the area, the owner copies
    in what its peers take and each reader copies its part out (one that places nothing, a
    reduce-scatter's, works straight out of the area instead: it copies nothing), copies that
    run out of the caches while the cores share theirs; in place, each reader reads its part by
    a system call (into scratch, where it places nothing), at two to four times a copy's time a
    byte (docs/performance.md, "Pair areas of a megabyte, and inputs through the areas by the
    road measured cheaper"). So each rank times its moves of the kind, a byte each: as owner,
    its copy in ("in"); as reader, its copies out of its peers' areas ("out": none where it
    makes none) and its reads of their inputs ("read"). Each rank votes in every call for the
    road its own costs say is cheaper (`prefers_area`: in place while its reads cost under
    MARGIN times the copies they spare), and the next call takes the areas only where every
    rank voted so (`heard`); the area is the first road (`NumberedRoad`). A reader takes an
    input from wherever its owner's word says it lies, so owners could choose alone, and did:
    then one rank, whose reads had looked dear, put its input in its area while its peer left
    its own in place, and made the copies and the read both, while its peer waited. A 1 MiB
    all-to-all on 2 ranks took 83-91 us a call so, against 49-51 through both areas, in a
    third of the 1500 calls of two runs of six (calls 9 to 512 of each).
    """

    MARGIN = 0.75

    def __init__(self, copied: int, taken: int) -> None:
        super().__init__("in", "out", "read")
        self.copied, self.taken = copied, taken  # what an owner copies in, a reader takes

    def prefers_area(self) -> bool:
        """This rank's vote, by its own costs: True for the areas."""
        copy_in, copy_out, read = self.cost["in"], self.cost["out"], self.cost["read"]
        return copy_in is not None and (  # (no copy out timed: its readers made none)
            read is None or read >= self.MARGIN * (copy_in * self.copied / self.taken
                                                   + (copy_out or 0)))


class PushRoad(VotedRoad):
    """Whether a two-rank all-gather's inputs of PUSHED_BYTES or more are written by their
    owners into their peers' results (see "Pushed inputs"), or read in place by their peers.

    Neither always wins on one machine. Written, an owner's input goes out of its caches, just
    read there to place its own block, and lands at its peer's result; read, the peer's core
    fetches it from the owner's memory. But a write into memory that the other core read last
    waits, in a slow spell, for that core's copy of each line to be dropped (as `ForwardRoad`'s
    does), where a read does not; and a write's lines land in its peer's caches while the
    peer is busy with its own block. So each rank times the rest of the call on the road
    taken, from when both have come (its own block's copy, its move, its wait for its peer's),
    a byte each ("write" or "read"), and votes for the cheaper; the inputs are written where
    both voted so. Writes are the first road (`NumberedRoad`).
    """

    def __init__(self) -> None:
        super().__init__("write", "read")

    def prefers_writes(self) -> bool:
        """This rank's vote, by its own costs: True for writes."""
        write, read = self.cost["write"], self.cost["read"]
        return write is not None and (read is None or write <= read)


class LeftRoad(NumberedRoad):
    """Whether an owner that takes nothing of a one-shot input that its reader reduces (a
    two-rank reduce's other rank, from SHARED_BYTES: see "Shared inputs") copies it into its
    area, or leaves it where it lies for its reader to read.

    Through the area the owner copies it into memory that its reader read in the call before,
    which in a slow spell of the third machine costs several times a copy (a 1 MiB reduce took
    444-552 us so, 41-48 in a fast spell); left in place, the reader reads it by a system call,
    at two to four times a copy's time a byte, whatever the spell. The owner times its whole
    exchange on either road: through the area its copy, in place its wait for the reader's
    read, beside what both roads share. Its reader takes the input from wherever its word says
    it lies, so the owner chooses alone. (`Sharing`, which weighs the copy against a fixed
    bound, left it in place in runs where the area took 41-48 us.) Measured on 2 ranks
    (docs/performance.md, "A reduce on two ranks, its peer's chunk written into the root"): in
    slow runs a 1 MiB reduce took 126-130 us where it took 440-449 through the area, in fast
    ones 41-46 as before.
    """

    def __init__(self) -> None:
        super().__init__("area", "place")

    def leaves(self) -> bool:
        """The road of the next call: True left where it lies."""
        return not self._first(lambda: self.cost["area"] <= self.cost["place"])


class ForwardRoad(NumberedRoad):
    """Whether a two-rank ring all-reduce's middle-sized chunks take the forwarded step (see
    "Forwarded results") or the ring's two steps, each by its own roads (`reduced_roads`, then
    `roads`); in a road of its own, whether a two-rank reduce's step and message do (its
    result going one way).

    Neither always wins on one machine. The two steps copy through the slots, in the caches,
    where the cores share theirs; but each rank then writes into memory that its peer read in
    the call before (the slots, and the chunk its peer read back), and where the two cores do
    not share a cache (the third machine's slow spells) each such write waits for the peer's
    copy of the line to be dropped: a 2 MiB all-reduce took 1.1-1.6 ms so, where the forwarded
    step, whose every write lands in memory that only the writer touches, took 0.25-0.33 ms in
    both kinds of spell; in the fast ones the two steps took 0.19 (docs/performance.md,
    "Forwarded results by the road measured cheaper"). So each rank times the whole of the
    call's step on either road, from when both ranks have come, and votes for the cheaper; the
    forwarded step goes only where both vote for it (the ring's steps come first,
    `NumberedRoad`).
    """

    def __init__(self) -> None:
        super().__init__("steps", "forward")

    def forwards(self) -> bool:
        """This rank's vote for the next call: True for the forwarded step."""
        return not self._first(lambda: self.cost["steps"] <= self.cost["forward"])


class SlotTransport(Transport):
    """Ranks of `comm` (default `MPI.COMM_WORLD`), all on one node, exchanging through slots in
    `memory`. A transport is this protocol with a name, defaults and a memory kind."""

    answers_messages_met = True  # (see "Folded checks")

    def __init__(self, comm: MPI.Comm | None, memory: MemoryKind, *, device: str | None = None,
                 node_size: int | None = None, **options: Any) -> None:
        if device not in (None, memory.device):
            raise InvalidArgumentError(f"the {self.name} transport moves {memory.device} "
                                       f"arrays, not {device} ones")
        self.memory = memory
        with duplicated(comm) as self.comm:
            super().__init__(self.comm.Get_rank(), self.comm.Get_size(), xp=memory.xp,
                             **options)
            if not on_one_node(self.comm, node_size):
                raise CollectiveError(f"the {self.name} transport needs every rank on one node, "
                                      f"but these ranks span nodes; use transport='mpi' or "
                                      f"'auto'")
            start(self.comm, self)
            self._setup()

    def _setup(self) -> None:
        size = self.size
        self.slot_bytes = max(LINE, self.segment_bytes // LINE * LINE)  # any itemsize divides it
        # At least a page, so that small exchanges (the call check too) always take an area.
        self._area_bytes = max(PAGE, -(-self.one_shot_bytes // LINE) * LINE)
        self._slot_line = CONSUMED + size
        first_call_line = self._slot_line + SLOTS
        self._call_line = first_call_line
        self._pair_line = first_call_line + 2
        self._share_line = self._pair_line + 2 * size
        self._push_line = self._share_line + size
        control = -(-(self._push_line + size) * LINE // PAGE) * PAGE
        pairs_at = SLOTS * self.slot_bytes + 2 * self._area_bytes
        self._pair_area_bytes = pair_area_bytes(size)
        data = pairs_at + (2 * (size - 1) * self._pair_area_bytes
                           if self.memory.in_host_region else 0)
        nbytes = control + (data if self.memory.in_host_region else 0)
        self._check_room(nbytes)
        regions = share_regions(self.comm, nbytes)
        # Counter i of rank r is self._ctl[r][i * WORDS], the size beside it the next word.
        # (Indexing a memoryview is several times cheaper than indexing an array.)
        self._ctl = [memoryview(r[:control]).cast("Q") for r in regions]
        self._own = self._ctl[self.rank]
        self._ctl_bytes = [memoryview(r[:control]) for r in regions]  # for struct's pack/unpack
        self._data = self.memory.share(self.comm, regions, control, data)
        self._slots = [[d[j * self.slot_bytes:(j + 1) * self.slot_bytes] for j in range(SLOTS)]
                       for d in self._data]
        self._slot_words = [(self._slot_line + j) * WORDS for j in range(SLOTS)]
        # Our pair areas for each peer, and each peer's for us, by the parity of the turn, as
        # memoryviews (a readied step makes arrays of its messages' dtypes of them), none with
        # ourselves; None where the data is not on the host (see "Pair areas").
        self._pair_out = self._pair_in = None
        if self.memory.in_host_region:
            def area(r: int, p: int, parity: int) -> Any:  # rank r's for peer p
                lo = pairs_at + (2 * (p - (p > r)) + parity) * self._pair_area_bytes
                return memoryview(self._data[r][lo:lo + self._pair_area_bytes])
            self._pair_out = [None if p == self.rank else
                              [area(self.rank, p, parity) for parity in range(2)]
                              for p in range(size)]
            self._pair_in = [None if p == self.rank else
                             [area(p, self.rank, parity) for parity in range(2)]
                             for p in range(size)]
        self._one_segment_bytes = min(self.slot_bytes, DIRECT_BYTES - 1)  # see `_one_segment`
        # isends that a slot cannot hold are read in place: streamed, one would hold its sender
        # until the receiver runs (measured on 4 ranks sharing 2 cores, a scatter of 2-8 MiB
        # took 1.3x-2.6x less time, docs/transports.md, "Shared memory"; on 2 ranks with a core
        # each, a 4 MiB one 1.6x-1.8x less, docs/performance.md, "A second machine"). One a slot
        # holds goes through it (the receiver's short way, `_take`, takes it from there): read
        # in place, a scatter's 128 KiB-512 KiB blocks took 1.3x-1.5x longer.
        self.isends_read_from = self.slot_bytes + 1
        # Per one-shot area, our call line and the peers', as words: written, and compared,
        # whole (`call_line`).
        lines = [[ctl[(first_call_line + area) * WORDS:][:CALL_WORDS + 1] for ctl in self._ctl]
                 for area in range(2)]
        self._call_lines = [(line[self.rank], line[:self.rank] + line[self.rank + 1:])
                            for line in lines]
        pids = self.comm.allgather(os.getpid())
        # Watch peers for death only if their pids mean something here (same pid namespace).
        self._pids = pids if all(_alive(p) for p in pids) else None
        self._checks = 0  # of peers' lives (`_check_peer`)
        # Messages from DIRECT_BYTES up are read straight out of the sender's buffer, where
        # the memory kind can: one copy instead of two, through no slot.
        self.single_copy = self.memory.can_read(self.comm, pids, self._pids is not None)
        # ... copies from CROWDED_DIRECT_BYTES up where ranks outnumber the cores.
        self.copies_direct_from = CROWDED_DIRECT_BYTES if self.oversubscribed else DIRECT_BYTES
        # One-way messages from here up are shared (see "Shared copies"); None: none are.
        self.shares_from = SHARED_BYTES if self.single_copy and not self.oversubscribed else None
        # Blocks moved one-sided (`locate`, `get`: "One-sided moves"), where direct reads work.
        self.one_sided = self.single_copy and self.memory.in_host_region
        # The one-shot areas take only the bytes of a flat byte input that peers take (`unread`).
        self.moves_what_is_read = self.memory.in_host_region
        # A page more than a piece, so that each piece lands where `_reduced_pieces` puts it.
        self._scratch = numpy.empty(READ_PIECE_BYTES + PAGE, numpy.uint8) \
            if self.single_copy else None
        # Middle-sized messages go by the road measured cheaper (`Roads`), where either can
        # run: direct reads work, and every rank has a core (the times of ranks that share one
        # measure the scheduler). None: through the slots.
        self.roads = Roads() if self.single_copy and not self.oversubscribed else None
        # ... each way apart for a message its receiver reduces (a ring step of a reduce-scatter
        # or an all-reduce), whose copy out of the slots is a reduction.
        self.reduced_roads = Roads() if self.roads is not None else None
        # ... and, on two ranks, a ring all-reduce's middle-sized chunks, fused or not, and
        # a reduce's (`ForwardRoad`), by whether the result goes both ways.
        self.forward_roads = {True: ForwardRoad(), False: ForwardRoad()} \
            if self.roads is not None and size == 2 else None
        # ... and so do one-shot inputs read in place that an area holds (`InputRoad`).
        self.input_roads = True
        # One-shot inputs of which each rank takes this much or more are read in place, where
        # the caller names what it takes (see "Inputs read in place"); None: none are.
        self.reads_inputs_from = None if not self.single_copy else \
            CROWDED_INPUT_BYTES if self.oversubscribed else DIRECT_INPUT_BYTES
        # ... of inputs larger than this: where ranks outnumber cores, those that an area does
        # not hold (a smaller one takes one exchange through the areas, as fast or faster).
        self.reads_inputs_above = self._area_bytes if self.oversubscribed else 0
        # A checked pair's messages from here up each way are read in place, and each half of
        # a ring shift's (see "Pair messages read in place"); where ranks outnumber the cores,
        # from where the general way reads directly too; None: none are.
        self.pairs_read_from = self._pair_area_bytes + 1 if self.roads is not None else \
            max(CROWDED_DIRECT_BYTES, self._pair_area_bytes + 1) if self.single_copy else None
        # Below that, each kind of sendrecv with a peer of PAIR_ROADS_FROM or more each way
        # takes the road its own `PairRoad` has measured cheaper, by (peer, bytes sent,
        # received), kept as the exchanges are.
        self.pair_roads: dict[tuple[int, int, int], PairRoad] = {}
        # One-shot inputs of this size or more in registered memory are left where they lie,
        # where the call names its reads (see "Registered memory"); None: none are. Not where
        # ranks outnumber cores: an owner waits for its readers, which wait for its core
        # (measured on 4 ranks sharing 2 cores, a 512 KiB all-reduce took 2x-3x longer).
        self.references_from = REFERENCE_BYTES if not self.oversubscribed else None
        # One-shot inputs of this size or more, on two ranks with a core each, may be shared
        # by their owner and their reader (see "Shared inputs"); None: none are.
        self.shares_inputs_from = SHARED_BYTES \
            if self.shares_from is not None and size == 2 else None
        self.sharing = Sharing()  # whether such an input, or a one-way message, is shared now
        # Whether a one-way message that its receiver reduces is read directly now, where every
        # rank has a core (`_stream`, "Direct reads"): while copies into the slots cost more
        # than REDUCED_SLOW a byte.
        self.reduced_sends = Sharing(REDUCED_SLOW)
        # Each kind of send alone of PAIR_ROADS_FROM or more goes through the area or is left
        # in place as its own `SendRoad` has measured: a ring shift's where ranks outnumber the
        # cores (see "Crowded ring shifts"), one with no recv beside it where every rank has a
        # core ("Sends alone"); by (peer, bytes sent), kept as the exchanges are. None: no
        # direct reads.
        self.send_roads: dict[tuple[int, int], SendRoad] | None = {} \
            if self.single_copy and self.memory.in_host_region else None
        self._registered: list[list[Any]] = []  # per registered region: every rank's mapping
        self._registered_at: list[tuple[int, int]] = []  # per region: our mapping's [lo, hi)
        self._mapped_at: list[list[int]] = []  # per region: where we map each rank's
        self._sent = [0] * size  # segments sent to each rank
        self._taken = [0] * size  # segments taken from each rank (mirrors our consumed lines)
        self._occupant: list[tuple[int, int] | None] = [None] * SLOTS  # (dst, seq) per slot
        self._next_slot = 0
        self._expect = [0] * size  # the slot of each peer to look at first for our next segment
        self._barriers = 0
        self._one_shots = 0
        self._pairs = [0] * size  # pair checks made with each rank (`say_pairs`)
        self._posts = [0] * size  # forwarded results from each rank posted for (push lines)
        self._pushes = [0] * size  # forwarded results pushed to each rank
        self._pending: Callable[[], None] | None = None  # the call's check, until made
        # The one-shot exchange of each (shape, dtype) seen: its views are made once.
        self._exchanges: dict[tuple, Callable[[Any, memoryview], list[Any]]] = {}
        self._inputs_read: Any = None  # where the inputs read in place land, once needed

    def _check_room(self, nbytes: int) -> None:
        """Fail on every rank, before anything is allocated, if /dev/shm cannot hold the job."""
        free = self.comm.allreduce(free_bytes(), op=MPI.MIN)
        need = nbytes * self.size
        if free < need:
            raise CollectiveError(
                f"{SHM_DIR} has {free / 2**20:.1f} MiB free, but the {self.name} transport needs "
                f"{need / 2**20:.1f} MiB ({self.size} ranks x {nbytes / 2**20:.1f} MiB: "
                f"{SLOTS} slots of segment_bytes={self.slot_bytes}, 2 one-shot areas of "
                f"{self._area_bytes} B and the pair areas); pass a smaller segment_bytes, "
                f"enlarge {SHM_DIR} "
                f"(docker run --shm-size=...), or use transport='mpi'")

    # ---- the protocol -----------------------------------------------------------------------

    def _sendrecv(self, sendbuf: Any | None, dst: int | None,
                  recvbuf: Any | None, src: int | None) -> None:
        self._stream(sendbuf, dst, recvbuf, src, None, None)

    def _sendrecv_reduce(self, sendbuf: Any | None, dst: int | None,
                         accbuf: Any, src: int, op: ReduceOp, inbuf: Any) -> None:
        self._stream(sendbuf, dst, accbuf, src, op, inbuf)

    def _send_reduced(self, sendbuf: Any, dst: int) -> None:
        # A receiver streams it whole, reducing each slot as it comes; or, where it is read
        # directly (`reduced_sends`), reads and reduces it a piece at a time.
        self._stream(sendbuf, dst, None, None, None, None, shared=False, reduced=True)

    def _stream(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                src: int | None, op: ReduceOp | None, inbuf: Any | None,
                shared: bool = True, reduced: bool = False) -> None:
        """Publish `sendbuf` to `dst` while taking `recvbuf` from `src`, a slot at a time or
        by a direct read (with `op`: recvbuf = op(inbuf, what arrives)). A middle-sized copy
        goes by the road measured cheaper, and its copies are timed now and then (`Roads`),
        and so does a middle-sized one that is reduced (`reduced_roads`, its reductions out of
        the slots timed); where ranks outnumber the cores, by direct read from
        CROWDED_DIRECT_BYTES.
        A large message sent one way only goes shared, where `shared` and every rank has a
        core (see "Shared copies"); below DIRECT_BYTES, while `Sharing` says so, else
        through the slots, its copies into them timed for `Sharing`. One whose receiver
        reduces it (`reduced`) of REDUCED_DIRECT_BYTES or more, where every rank has a core, is
        read directly while `reduced_sends` says so, else goes through the slots, timed."""
        slot = self.slot_bytes
        if op is None and not self._registered \
                and (sendbuf is None or sendbuf.nbytes <= self._one_segment_bytes) \
                and (recvbuf is None or recvbuf.nbytes <= self._one_segment_bytes):
            self._one_segment(sendbuf, dst, recvbuf, src)
            return
        out = sendbuf.view(numpy.uint8) if sendbuf is not None else None
        into = recvbuf.view(numpy.uint8) if recvbuf is not None else None
        region = self._region_of(out) if out is not None and self._registered else None
        shared = (shared and region is None and into is None and out is not None
                  and self.shares_from is not None and out.size >= self.shares_from)
        gauged = shared and out.size < DIRECT_BYTES and not self.sharing.shares()
        shared = shared and not gauged
        gauge = self.sharing if gauged else None  # (where the slots' copies are timed for)
        # (A one-way message its receiver reduces: read directly, or through the slots, timed.)
        leaves = False
        if reduced and self.roads is not None and region is None \
                and out.size >= REDUCED_DIRECT_BYTES:
            leaves = self.reduced_sends.shares()
            gauge = None if leaves else self.reduced_sends
        # (Sent while receiving: a ring step, whose receiver reduces what it takes where there
        # is an `op`, as this rank does; each kind by its own roads.)
        roads = None if out is None or into is None else \
            self.roads if op is None else self.reduced_roads
        direct_from = self.copies_direct_from if op is None else DIRECT_BYTES
        middle = roads is not None and region is None and self._middle(out.size)
        direct = out is not None and (region is not None or shared or leaves or self.single_copy
                                      and into is not None and (out.size >= direct_from
                                                                or middle and roads.direct()))
        publish, take = self._publish, self.memory.copy
        timed = roads is not None and self._middle(into.size)  # (what arrives: timed too)
        sampled = (middle and not direct or timed) and roads.sample()
        if sampled:
            if middle and not direct:
                publish = roads.timed("in", publish)
            if timed and op is None:  # (a reduction out of a slot is timed where it is made)
                take = roads.timed("out", take)
        spent = 0.0  # seconds in copies into the slots, where `gauge`
        if gauge is not None:
            untimed = publish

            def timed_publish(piece: Any, dst: int, nbytes: int) -> None:
                nonlocal spent
                started = time.perf_counter()
                untimed(piece, dst, nbytes)
                spent += time.perf_counter() - started
            publish = timed_publish
        n_out = 0 if out is None else 1 if direct else -(-out.size // slot)
        n_in = 0 if into is None else -(-into.size // slot)
        k_out = k_in = 0
        read_by = None  # (dst, seq) of a message the receiver reads from our buffer
        if direct and self._pending is not None:
            # A message read in place is announced only once the check has passed: announced
            # first, a check that timed out would leave it for a late peer to read, from a
            # buffer the caller has taken back. (Announcing copies nothing to overlap.)
            self._check_first(dst, 0)
        while True:
            while k_out < n_out and self._slot_free():
                if direct:
                    read_by = self._announce(dst, out.size, *region) if region else \
                        self._announce(dst, out.size, address=buffer_address(out), shared=shared)
                else:
                    publish(out[k_out * slot:(k_out + 1) * slot], dst, out.size)
                k_out += 1
            if self._pending is not None:
                self._check_first(dst, k_out)
            while k_in < n_in:
                j = self._find(src)
                if j is None:
                    break
                if k_in == 0:
                    self._check_size(src, j, into.size)
                    line = self._slot_words[j]
                    # Where the peer's message lies (names of their own: `region` still says
                    # where ours does, and ours may not have gone yet).
                    their_address, their_region, their_offset = self._ctl[src][line + 2:line + 5]
                    if their_region:
                        mapped = self._registered[their_region - 1][src]
                        mapped = mapped[their_offset:their_offset + into.size]
                        if op is None:
                            into[...] = mapped
                        else:
                            op(inbuf, mapped.view(recvbuf.dtype), out=recvbuf)
                    elif their_address and self._ctl[src][line + 5] and op is None:
                        self._take_shared(src, their_address, into)
                    elif their_address:
                        started = time.perf_counter()
                        self._read(src, their_address, into, recvbuf.dtype, op, inbuf)
                        if timed:
                            roads.took("read", time.perf_counter() - started, into.size)
                    if their_region or their_address:
                        self._consumed(src)
                        k_in = n_in
                        break
                piece = into[k_in * slot:(k_in + 1) * slot]
                segment = self._slots[src][j][:piece.size]
                if op is None:
                    take(piece, segment)
                else:
                    mine = inbuf.view(numpy.uint8)[k_in * slot:(k_in + 1) * slot]
                    started = time.perf_counter() if sampled and timed else 0.0
                    self.memory.reduce(op, piece.view(recvbuf.dtype), mine.view(recvbuf.dtype),
                                       segment.view(recvbuf.dtype))
                    if sampled and timed:  # (its reduction out of the slot: `reduced_roads`)
                        roads.spend("out", time.perf_counter() - started, piece.size)
                self._consumed(src)
                k_in += 1
            if k_out == n_out and k_in == n_in:
                if read_by is not None and not self._has_taken(*read_by):
                    if shared:
                        self._give_shared(read_by, out)
                    self.wait(lambda: self._has_taken(*read_by), dst, "its message to be read")
                if sampled:
                    roads.settle()
                if gauge is not None:
                    gauge.took(spent, out.size)
                return
            self.wait(lambda: (k_out < n_out and self._slot_free())
                      or (k_in < n_in and self._find(src) is not None),
                      src if k_in < n_in else self._slot_holder(),
                      "a segment" if k_in < n_in else "a free slot")

    def reduce_forward(self, sendbuf: Any, dst: int, accbuf: Any, src: int, op: ReduceOp,
                       inbuf: Any, recvbuf: Any | None, divide: int, smallest: int,
                       onward: bool = True) -> None:
        """Fused where direct reads are, every rank has a core and every chunk is of
        DIRECT_BYTES or more (see "Forwarded results"), and on two ranks with chunks from
        REDUCED_DIRECT_BYTES to DIRECT_BYTES where both measure it cheaper (`ForwardRoad`, one
        for each kind: the result both ways, or one); else as `Transport.reduce_forward`. A
        result that goes one way (a reduce's) is fused only so: of larger chunks, the root's
        peer, writing the whole of its chunk while the root writes none, took longer than the
        two steps (a 16 MiB reduce on 2 ranks, 2.6-3.3 ms against 2.1-2.7). Counted, and
        traced, as the two steps it makes."""
        both = onward and recvbuf is not None
        road = None if self.forward_roads is None or not \
            REDUCED_DIRECT_BYTES <= smallest < DIRECT_BYTES else self.forward_roads[both]
        if road is None and not (both and self.single_copy and not self.oversubscribed
                                 and smallest >= DIRECT_BYTES):
            super().reduce_forward(sendbuf, dst, accbuf, src, op, inbuf, recvbuf, divide,
                                   smallest, onward)
            return
        sendbuf, accbuf = self._check(sendbuf, dst), self._check(accbuf, src)
        if recvbuf is not None:
            recvbuf = self._check(recvbuf, src)
        if inbuf.shape != accbuf.shape or inbuf.dtype != accbuf.dtype:
            raise ValueError("inbuf must match accbuf in size and dtype")
        if self._pending is not None:  # (before the post and the announcement: see `_stream`)
            self._check_first(dst, 0)
        # Where the left neighbour's result lands (nowhere: none is taken), with this rank's
        # vote for the forwarded step: posted before we wait on either neighbour's data or
        # post, so that no rank waits on a neighbour that waits on it.
        vote = road is None or road.forwards()
        self._posts[src] += 1
        post = (self._push_line + src) * WORDS
        self._own[post + 1], self._own[post + 2] = (0, 0) if recvbuf is None else \
            (buffer_address(recvbuf), recvbuf.nbytes)
        self._own[post + 4] = vote
        self._own[post] = self._posts[src]  # last: the left neighbour may write now
        try:
            forward = road is None or self._both_forward(dst, vote)
            started = time.perf_counter()  # (both ranks have come)
            if forward:
                self._forward(sendbuf, dst, accbuf, src, op, inbuf, recvbuf, divide, onward)
        except BaseException:
            if recvbuf is not None:
                _LENT.append(recvbuf)  # a live left neighbour may still write into it
            raise
        if not forward:
            super().reduce_forward(sendbuf, dst, accbuf, src, op, inbuf, recvbuf, divide,
                                   smallest, onward)
        if road is not None:
            road.took("forward" if forward else "steps", time.perf_counter() - started,
                      accbuf.nbytes)

    def _both_forward(self, dst: int, vote: bool) -> bool:
        """Whether this rank's `vote` and dst's, which comes with its post for us, are both for
        the forwarded step (two ranks: dst is also the left neighbour); if not, dst's post is
        passed over, no result written into it."""
        if vote and self._post_of(dst)[4]:
            return True
        self._pushes[dst] += 1
        return False

    def _post_of(self, dst: int) -> Any:
        """dst's post for us for this turn, once it has come, in its control lines: its count,
        where our result lands and its size, then (word 4) its vote."""
        posts = (self._push_line + self.rank) * WORDS
        turn, theirs = self._pushes[dst] + 1, self._ctl[dst]
        self.wait(lambda: theirs[posts] >= turn, dst, "where its result lands")
        return theirs[posts:posts + WORDS]

    def _forward(self, sendbuf: Any, dst: int, accbuf: Any, src: int, op: ReduceOp,
                 inbuf: Any, recvbuf: Any | None, divide: int, onward: bool) -> None:
        """The forwarded step, once this rank has posted where its left neighbour's result
        lands: its outgoing chunk announced for a direct read, the left's reduced and, where
        `onward`, written on into dst; the left's result waited for, where one comes."""
        phase, step, then = self.phase, self.step, result_phase(onward, recvbuf)
        reduced = self._count("reduce", sendbuf, dst, accbuf, src)
        self.at(then, 0)
        copied = self._count("copy", accbuf if onward else None, dst if onward else None,
                             recvbuf, None if recvbuf is None else src)
        self.at(phase, step)
        out = sendbuf.view(numpy.uint8)
        region = self._region_of(out) if self._registered else None
        self.wait(self._slot_free, self._slot_holder(), "a free slot")
        read_by = self._announce(dst, out.size, *region) if region else \
            self._announce(dst, out.size, address=buffer_address(out))
        self._reduce_and_push(src, dst if onward else None, accbuf, op, inbuf, divide)
        if reduced is not None:
            reduced["end"] = time.perf_counter()
        self.at(then, 0)
        if recvbuf is not None:
            landed = (self._push_line + self.rank) * WORDS + 3  # in src's control lines
            self.wait(lambda: self._ctl[src][landed] >= self._posts[src], src,
                      "its reduced chunk")
        self.wait(lambda: self._has_taken(*read_by), dst, "its message to be read")
        if copied is not None:
            copied["end"] = time.perf_counter()

    def _reduce_and_push(self, src: int, dst: int | None, accbuf: Any, op: ReduceOp,
                         inbuf: Any, divide: int) -> None:
        """accbuf = op(inbuf, src's announced message) / divide, a piece at a time, each
        piece written on into the buffer that `dst` posted as soon as it is reduced (dst None:
        kept; on two ranks, dst is src)."""
        j = self._wait_find(src)
        into = accbuf.view(numpy.uint8)
        self._check_size(src, j, into.size)
        address, region, offset = self._ctl[src][self._slot_words[j] + 2:self._slot_words[j] + 5]
        peer = src if dst is None else dst  # (whose post this call's turn passes)
        turn = self._pushes[peer] + 1
        if dst is not None:
            _, target, nbytes = self._post_of(dst)[:3]
            if nbytes != into.size:
                raise MismatchError(f"rank {self.named(self.rank)} would send {into.size} "
                                    f"bytes to rank {self.named(dst)} "
                                    f"but it expects {nbytes}"
                                    + self.during())
        # The message: where it lies in src's memory, or our mapping of its registered memory.
        message = self._registered[region - 1][src][offset:offset + into.size] if region \
            else address
        for lo, hi in self._reduced_pieces(src, message, into, accbuf.dtype, op, inbuf):
            if divide != 1:
                piece = into[lo:hi].view(accbuf.dtype)
                self.xp.true_divide(piece, divide, out=piece)
            if dst is not None:
                self._move(self.memory.write, dst, "write its result into rank {}",
                           target + lo, into[lo:hi])
        self._consumed(src)
        # This turn passed on either way, so that the counters go on in step (a rank with
        # no result to write passes its peer's post over).
        self._pushes[peer] = turn
        self._own[(self._push_line + peer) * WORDS + 3] = turn  # our result has landed

    def _move(self, move: Callable[..., None], peer: int, what: str, *args: Any) -> None:
        """move(peer's pid, *args): a move between this rank's memory and `peer`'s (memory.read
        or memory.write, or read_peer_bytes); if the peer died, or the kernel changed its
        mind, an error that says `what` could not be done, the peer named at its "{}" (made
        into words only then: at a few microseconds a move, a message formatted each time
        shows)."""
        try:
            move(self._pids[peer], *args)
        except OSError as error:
            self._check_peer(peer, thorough=True)
            raise CollectiveError(f"rank {self.named(self.rank)} could not "
                                  f"{what.format(self.named(peer))}" + self.during()) from error

    def _middle(self, nbytes: int) -> bool:
        """Whether a message of `nbytes` is middle-sized: more than a segment, less than
        DIRECT_BYTES (`Roads`)."""
        return self._one_segment_bytes < nbytes < DIRECT_BYTES

    def message(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                src: int | None, check: Callable[[], None] | None) -> None:
        """A message of at most a segment each way, untraced, goes straight to `_one_segment`
        with its check pending, and is counted once it has moved (a mismatch withdraws what
        was published, and counts nothing); others as `Transport.message`."""
        if not self._straight(sendbuf, recvbuf):
            super().message(sendbuf, dst, recvbuf, src, check)
            return
        self._pending = check
        self._one_segment(sendbuf, dst, recvbuf, src)
        self._count("copy", sendbuf, dst, recvbuf, src)  # untraced: it only counts

    def _straight(self, sendbuf: Any | None, recvbuf: Any | None) -> bool:
        """Whether a message of `sendbuf` and `recvbuf` (None: no such side) goes straight
        through the slots: untraced, from no registered memory, a segment at most each way."""
        if self.trace is not None or self.on_transfer is not None or self._registered:
            return False
        for buf in (sendbuf, recvbuf):
            if buf is not None and not 0 < buf.nbytes <= self._one_segment_bytes:
                return False
        return True

    def pair_message(self, mine: Any, peer: int, into: Any, said: tuple[int, ...] | None,
                     expected: tuple[int, ...] | None) -> bool | tuple[int, ...]:
        """A sendrecv with one `peer` of at most a segment each way, untraced: `message`'s
        steps for this, the commonest message, written out in one place (its Python is most
        of its time). `said`: this rank's six words of the pair's check (None: unchecked),
        `expected` the peer's if it agrees. True once moved and counted; False, having done
        nothing, for a message `message` must take; or the peer's words where they differ
        from `expected`, having withdrawn what was published and taken nothing. A checked,
        untraced message of `pairs_read_from` or more each way, of any size, is read in
        place instead, as is one from registered memory of more than REGISTERED_PAIR_BYTES,
        whatever comes back (a peer whose message goes the general way meets it there). (A run of
        messages of one kind takes a readied step instead, `prepare_pair_message`, which alone
        uses the pair areas: this way takes the others, through the slots.)"""
        reads_from = self.pairs_read_from
        if said is not None and self.trace is None and self.on_transfer is None:
            word = self._address_word(mine) if self._registered else 0
            if word & REGISTERED and mine.nbytes > REGISTERED_PAIR_BYTES \
                    or reads_from is not None and mine.nbytes >= reads_from \
                    and into.nbytes >= reads_from:
                return self._through_pair_lines(mine, peer, into, said, expected,
                                                word or buffer_address(mine))
        if not self._straight(mine, into):
            return False
        if not self._slot_free():
            self.wait(self._slot_free, self._slot_holder(), "a free slot")
        self._publish(mine.view(numpy.uint8), peer, mine.nbytes)
        if said is not None:  # `say_pairs` for one peer
            heard = self._hear(peer, said, self._say(peer, said))
            if heard != expected:
                self._withdraw(peer, 1)
                return heard
        self._take(peer, into.view(numpy.uint8))
        self._count("copy", mine, peer, into, peer)  # untraced: it only counts
        return True

    def _through_pair_lines(self, mine: Any, peer: int, into: Any, said: tuple[int, ...],
                            expected: tuple[int, ...], where: int) -> bool | tuple[int, ...]:
        """`pair_message` of a message left in place for the peer to read ("Pair messages
        read in place": `where` it lies, `_address_word`), our words marked IN_PLACE; then,
        once the peer's words have come and agree, the peer's data from where its mark says,
        or, where it has none (its message goes the general way), both messages as the general
        way moves them once checked (`_sendrecv`). The result as `pair_message`'s."""
        turn = self._pairs[peer] + 1
        self._own[self._pair_words(peer, turn) + WORDS - 1] = where
        turn = self._say(peer, (said[0] | IN_PLACE, *said[1:]))
        heard = self._hear(peer, said, turn)
        if heard != expected:
            return heard  # (nothing to withdraw: the peer reads our data only on agreement)
        return self._take_pair(mine, peer, into, turn, IN_PLACE)

    def _take_pair(self, mine: Any, peer: int, into: Any, turn: int, how: int) -> bool:
        """Once the pair's words of `turn` agree, ours marked `how` (INLINE, IN_PLACE): the
        peer's data from where its mark says (or both messages the general way), then, for our
        data left IN_PLACE, the wait until the peer has read it. True."""
        line = self._pair_words(self.rank, turn)
        theirs = self._ctl[peer][line + 1]
        if theirs & INLINE:
            if into is not None:  # (None: a send alone)
                into.data.cast("B")[:] = self._pair_in[peer][turn & 1][:into.nbytes]
        elif theirs & IN_PLACE:
            word = self._ctl[peer][line + WORDS - 1]
            if word & REGISTERED:
                ctypes.memmove(buffer_address(into), self._mapped(peer, word), into.nbytes)
            else:
                self._move(self.memory.read, peer, "read rank {}'s message",
                           word, into.view(numpy.uint8))
            self._own[(self._share_line + peer) * WORDS + 3] = turn  # we have read it
        else:  # the peer's message goes the general way (checked): ours goes that way too
            self._sendrecv(mine, None if mine is None else peer, into,
                           None if into is None else peer)
        if how == IN_PLACE and theirs & MARKS:  # the peer reads `mine`
            read = (self._share_line + self.rank) * WORDS + 3  # in the peer's lines
            their_lines = self._ctl[peer]
            if their_lines[read] < turn:
                self.wait(lambda: their_lines[read] >= turn, peer, "its message to be read")
        self._count("copy", mine, peer, into, peer)  # untraced: it only counts
        return True

    def prepare_pair_message(self, peer: int, sent_bytes: int | None,
                             expected_bytes: int | None,
                             kind: tuple[int, int, int]) -> Callable[..., Any] | None:
        """`pair_message` made ready for a run of checked sendrecvs with one `peer`, of flat
        arrays of `sent_bytes` and `expected_bytes` whose description is `kind`
        (`check.pair_kind`), as `prepare_all_inputs` readies an exchange: the lines, areas,
        words and marks that stay from call to call are found once, so that a call writes
        its two numbers and moves its data. At 8 B the unprepared way took 22.7-23.2 us, most of
        it Python, and this one 14.5-15.0 (docs/performance.md, "Messages readied once"); then,
        its wait spinning on the peer's line before the general wait, and the lane's Python
        written out, 15.5-16.0 -> 10.6 in a slower spell (docs/performance.md, "Messages of
        one kind, written out").
        A send alone (`expected_bytes` None) or a recv alone (`sent_bytes` None) of up to a
        pair area and a segment goes the same way: its words, with the data in the sender's
        pair area, and one wait for the peer's (so a send returns once its receiver has come,
        as the general way's does). At 8 B on 2 ranks a send and its recv took 8.1-8.3 us a
        way so, where the general way's Python took 40-43. (A longer one goes the general way,
        whose slots let the receiver copy one segment out while the sender copies the next
        one in, and whose shared copies split the copy between both ends.)

        Returns `step(mine, into, n_sent, n_expected)` (`mine` or `into` None for a recv or
        a send alone), which answers as `pair_message`:
        True once moved and counted; the peer's words where they differ from this rank's,
        mirrored; False, having done nothing, while any memory is registered (whose messages
        `pair_message` reads where they lie) or once `pairs_read_from` has changed. None
        where the messages go neither through the pair areas nor in place (through the
        slots: `pair_message`, `message`)."""
        reads_from = self.pairs_read_from
        phases = self._pair_phases(peer, sent_bytes, expected_bytes, kind)
        if phases is None:
            return None
        publish, finish, _ = phases

        def step(mine: Any, into: Any, n_sent: int, n_expected: int) -> bool | tuple[int, ...]:
            if self._registered or self.pairs_read_from != reads_from:
                return False
            return finish(mine, into, n_sent, n_expected, publish(mine, n_sent, n_expected))
        return step

    def prepare_ring_message(self, dst: int, src: int, sent_bytes: int, expected_bytes: int,
                             kind: tuple[int, int, int]) -> Callable[..., Any] | None:
        """`prepare_pair_message` for a sendrecv with two peers (a ring shift): a send alone to
        `dst` and a recv alone from `src`, each published before either is waited for
        (`ring_step`); where one pair disagrees, the half whose pair agreed moves, as `message`
        moves it. None where either goes neither through the pair areas nor in place."""
        sending, receiving = ring_kinds(kind)
        out = self._pair_phases(dst, sent_bytes, None, sending, ring=True)
        come = self._pair_phases(src, None, expected_bytes, receiving, ring=True)
        if out is None or come is None:
            return None
        reads_from = self.pairs_read_from
        return ring_step(dst, out, src, come, self.wait,
                         lambda: self._registered or self.pairs_read_from != reads_from)

    def _pair_phases(self, peer: int, sent_bytes: int | None, expected_bytes: int | None,
                     kind: tuple[int, int, int], ring: bool = False) -> Half | None:
        """The two halves of a readied step with `peer` (`prepare_pair_message`): `publish(mine,
        n_sent, n_expected)`, which writes the data (or where it lies) and the words, and
        returns the pair's turn; and `finish(mine, into, n_sent, n_expected, turn)`, which
        waits for the peer's words and takes its data: True, or the peer's words where they
        differ (after a peer whose data lies elsewhere, True once taken from there). Then
        `spoken`, for `ring_step`: what the peer's words of a turn are, without waiting. None
        where the messages go neither through the pair areas nor in place. `ring`: a half of a
        ring shift's step (`prepare_ring_message`), read in place from the size a pair's
        messages are; a send or a recv alone never is (through the pair areas up to an area
        and a segment, else the general way)."""
        reads_from, area = self.pairs_read_from, self._pair_area_bytes
        if sent_bytes is None or expected_bytes is None:  # (see `prepare_pair_message`)
            area = min(area, self._one_segment_bytes)
        ways = [n for n in (sent_bytes, expected_bytes) if n is not None]
        if reads_from is not None and ways and min(ways) >= reads_from \
                and (len(ways) == 2 or ring):
            how = IN_PLACE
        elif self._pair_out is not None and (sent_bytes, expected_bytes) != (None, None) \
                and (sent_bytes is None or 0 < sent_bytes <= area) \
                and (expected_bytes is None or 0 < expected_bytes <= area):
            how = INLINE
        else:
            return None
        # Which road each call's message takes, where both can and every rank has a core (see
        # "Pair areas"; as `self.roads`): a road measured per kind of message, None where the
        # road is fixed.
        roads = None
        if how == INLINE and self.roads is not None and sent_bytes is not None \
                and expected_bytes is not None \
                and min(sent_bytes, expected_bytes) >= PAIR_ROADS_FROM:
            roads = kept(self.pair_roads, (peer, sent_bytes, expected_bytes), KEPT_EXCHANGES,
                         PairRoad)
        fixed = (how, MESSAGES | how, False)  # a call's road, its mark, whether it is timed
        # A send alone, a crowded ring shift's or one with no recv beside it where every rank
        # has a core: through the area or left in place, call by call, as its copies cost
        # (see "Crowded ring shifts", "Sends alone"); the call under way in `current`.
        send_road = None
        if self.send_roads is not None and how == INLINE and sent_bytes is not None \
                and sent_bytes >= PAIR_ROADS_FROM and reads_from is not None \
                and (ring if self.oversubscribed else not ring and expected_bytes is None):
            slow = SendRoad.SLOW if self.oversubscribed else SEND_SLOW
            send_road = kept(self.send_roads, (peer, sent_bytes), KEPT_EXCHANGES,
                             lambda: SendRoad(slow))
        current = [fixed]
        in_place = (IN_PLACE, MESSAGES | IN_PLACE, False)
        c_sent, c_expected, dtypes = kind
        mirrored = swapped_dtypes(dtypes)  # the peer's dtypes word
        ours, theirs = self._own, self._ctl[peer]
        our_bytes, their_bytes = self._ctl_bytes[self.rank], self._ctl_bytes[peer]
        pairs = self._pairs
        says = [self._pair_words(peer, parity) for parity in range(2)]  # our line to the peer
        hears = [self._pair_words(self.rank, parity) for parity in range(2)]  # its line to us
        outs, ins = (self._pair_out[peer], self._pair_in[peer]) if how == INLINE \
            else (None, None)
        read_at = (self._share_line + peer) * WORDS + 3  # ours: we have read the peer's turn
        read_by = (self._share_line + self.rank) * WORDS + 3  # the peer's: it has read ours
        published = PUBLISHED * WORDS  # the peer's one-shot turn (a collective: `spoken`)
        what = "read rank {}'s message"
        # What `_count` adds to `stats` for the two messages, summed once: a step is never
        # traced or watched (its caller takes those calls the general way).
        tally = self._tally([(sent_bytes or 0, peer, expected_bytes or 0, peer)])
        # The pair areas as arrays of the messages' dtypes, made for the first call's (a copy
        # between arrays of one dtype takes half a copy through a cast of bytes: 0.53 us
        # against 1.13 and 1.31 at 8 B): the dtypes, then our areas, then the peer's.
        typed: list[Any] = [None] * 4

        def publish(mine: Any, n_sent: int, n_expected: int) -> int:
            turn = pairs[peer] + 1
            line = says[turn & 1]
            road, first, timed = fixed if roads is None else roads.next()
            gauged = False  # (a send alone's copy timed)
            if send_road is not None:
                left, gauged = send_road.next()
                road, first, timed = current[0] = in_place if left else fixed
            if timed:
                first |= roads.say()
            if road == INLINE:
                if mine is not None:
                    if typed[0] is not mine.dtype:
                        typed[0], typed[2] = mine.dtype, [
                            numpy.frombuffer(out, mine.dtype, mine.size) for out in outs]
                    if timed:
                        started = time.perf_counter()
                    elif gauged:
                        started = time.thread_time()
                    typed[2][turn & 1][...] = mine
                    if timed:
                        roads.copied = time.perf_counter() - started
                    elif gauged:
                        send_road.took(time.thread_time() - started, mine.nbytes)
            elif mine is not None:
                ours[line + WORDS - 1] = buffer_address(mine)
            pairs[peer] = turn  # (`_say`)
            PAIR_WORDS.pack_into(our_bytes, (line + 1) * 8, first, n_sent, n_expected, c_sent,
                                 c_expected, dtypes)
            ours[line] = turn  # last: the words are now visible
            return turn

        def finish(mine: Any, into: Any, n_sent: int, n_expected: int,
                   turn: int) -> bool | tuple[int, ...]:
            line = hears[turn & 1]
            polls = self.spin
            while theirs[line] != turn:  # a short spin first, as the one-shot exchange's
                if not polls:
                    self._hear(peer, (MESSAGES, n_sent, n_expected, c_sent, c_expected,
                                      dtypes), turn)
                    break
                polls -= 1
            heard = PAIR_WORDS.unpack_from(their_bytes, (line + 1) * 8)
            road, first, timed = current[0] if roads is None else roads.call
            if timed:  # (the peer's preference, then its words as they are without it)
                roads.heard(heard[0])
                heard = (heard[0] & ~PREFERS_READ, *heard[1:])
            if heard != (first, n_expected, n_sent, c_expected, c_sent, mirrored):
                unmarked = (heard[0] & ~MARKS, *heard[1:])
                if unmarked != (MESSAGES, n_expected, n_sent, c_expected, c_sent, mirrored):
                    return unmarked  # (nothing to withdraw, as `_through_pair_lines`)
                return self._take_pair(mine, peer, into, turn, road)  # its data lies elsewhere
            if road == INLINE:
                if into is not None:
                    if typed[1] is not into.dtype:
                        typed[1], typed[3] = into.dtype, [
                            numpy.frombuffer(area, into.dtype, into.size) for area in ins]
                    if timed:
                        started = time.perf_counter()
                    into[...] = typed[3][turn & 1]
                    if timed:
                        roads.took(INLINE, roads.copied + time.perf_counter() - started)
            else:
                if into is not None:
                    if timed:
                        started = time.perf_counter()
                    self._move(self.memory.read, peer, what, theirs[line + WORDS - 1],
                               into.view(numpy.uint8))
                    if timed:
                        roads.took(IN_PLACE, time.perf_counter() - started)
                    ours[read_at] = turn  # we have read it
                polls = self.spin
                while mine is not None and theirs[read_by] < turn:
                    if not polls:
                        self.wait(lambda: theirs[read_by] >= turn, peer, "its message to be read")
                        break
                    polls -= 1
            tally()
            return True

        def spoken(n_sent: int, n_expected: int, turn: int, answered: list[int]) -> int:
            """What the peer's words of `turn` are, without waiting (`ring_step`); a peer in a
            collective meanwhile is answered, as `_hear` answers it."""
            line = hears[turn & 1]
            if theirs[line] != turn and (theirs[published] <= self._one_shots  # (no collective)
                                         or not self._answer_collective(
                                             peer, (MESSAGES, n_sent, n_expected, c_sent,
                                                    c_expected, dtypes), line, turn, answered)):
                return SILENT
            return READIED if theirs[line + 1] & MARKS else GENERAL_WAY
        return publish, finish, spoken

    def _one_segment(self, sendbuf: Any | None, dst: int | None, recvbuf: Any | None,
                     src: int | None) -> None:
        """`_stream` of a copy of at most one segment each way, as a small message is: the
        same steps (publish, the pending check, take), without the general loop's
        bookkeeping, which costs a small message more than its copies."""
        if sendbuf is not None:
            if not self._slot_free():
                self.wait(self._slot_free, self._slot_holder(), "a free slot")
            self._publish(sendbuf.view(numpy.uint8), dst, sendbuf.nbytes)
        if self._pending is not None:
            self._check_first(dst, sendbuf is not None)
        if recvbuf is None:
            return
        self._take(src, recvbuf.view(numpy.uint8))

    def sends_ahead(self, nbytes: int, reduced: bool = False) -> int:
        """A message of one segment, or one read in place, takes one slot (`_isend`): as
        many as there are slots, reduced or not. A longer one streams, and waits for its
        receiver."""
        if nbytes <= self.slot_bytes or self.single_copy and nbytes >= self.isends_read_from:
            return SLOTS
        return 0

    def _isend(self, buf: Any, dst: int) -> Callable[[], None]:
        """A message that its receiver reads in place (from registered memory, or by a direct
        read) is left there: announced now, waited for later. Others go whole now."""
        region = self._region_of(buf.view(numpy.uint8)) if self._registered else None
        if region is None and not (self.single_copy and buf.nbytes >= self.isends_read_from):
            return super()._isend(buf, dst)
        if self._pending is not None:  # (before the announcement: see `_stream`)
            self._check_first(dst, 0)
        self.wait(self._slot_free, self._slot_holder(), "a free slot")
        read_by = self._announce(dst, buf.nbytes, *region) if region else \
            self._announce(dst, buf.nbytes, address=buffer_address(buf))
        return lambda: self.wait(lambda: self._has_taken(*read_by), dst,
                                 "its message to be read")

    def check_first(self, check: Callable[[], None]) -> None:
        """Make the call's `check` in its first exchange, once this rank has published what fits
        in its free slots and before it takes any peer's data (see "Folded checks"); `checked`
        makes it for a call that moved no data."""
        self._pending = check

    def checked(self) -> None:
        """Make the call's check now, if no exchange has made it."""
        if self._pending is not None:
            self._check_first(None, 0)

    def _check_first(self, dst: int | None, published: int) -> None:
        """The pending check, once the `published` pieces that fitted have gone to `dst`; on a
        mismatch they are withdrawn, untaken, so the communicator can go on."""
        check, self._pending = self._pending, None
        phase, step = self.phase, self.step
        try:
            check()
            self.at(phase, step)  # the check names its own phase; the algorithm's goes on
        except MismatchError:
            self._withdraw(dst, published)
            raise

    def _withdraw(self, dst: int | None, published: int) -> None:
        """Take back the last `published` pieces sent to `dst`, untaken (a check that failed)."""
        for _ in range(published):
            j = (self._next_slot - 1) % SLOTS
            self._own[self._slot_words[j]] = 0
            self._occupant[j], self._next_slot = None, j
            self._sent[dst] -= 1

    def say_pairs(self, said: dict[int, tuple[int, ...]]) -> Heard:
        """Each peer's words go in our pair line to it, and `heard` reads the peer's in its
        line to us (see "Folded checks"); a peer in a collective call meanwhile is answered
        with our words (`_answer_collective`)."""
        turns = {peer: self._say(peer, words) for peer, words in said.items()}
        answered: dict[int, list[int]] = {peer: [] for peer in said}

        def heard(peer: int) -> tuple[int, ...] | None:
            line = self._pair_words(self.rank, turns[peer])
            if not self._answer_collective(peer, said[peer], line, turns[peer], answered[peer]):
                return None
            return self._words(peer, line)
        return heard

    def _say(self, peer: int, words: tuple[int, ...]) -> int:
        """Write `words` in our pair line to `peer`, for our next check with it: its turn."""
        self._pairs[peer] = turn = self._pairs[peer] + 1
        line = self._pair_words(peer, turn)
        PAIR_WORDS.pack_into(self._ctl_bytes[self.rank], (line + 1) * 8, *words)
        self._own[line] = turn  # last: the words are now visible
        return turn

    def _hear(self, peer: int, words: tuple[int, ...], turn: int) -> tuple[int, ...]:
        """`peer`'s words of check `turn`, once it has written them; a peer in a collective
        call meanwhile is answered with ours, `words` (`_answer_collective`)."""
        line = self._pair_words(self.rank, turn)
        if self._ctl[peer][line] != turn:
            answered: list[int] = []
            self.wait(lambda: self._answer_collective(peer, words, line, turn, answered), peer,
                      "a message")
        return self._words(peer, line)

    def _words(self, peer: int, line: int) -> tuple[int, ...]:
        """The six words in `peer`'s pair line at `line`, without the marks of where its data
        lies ("Pair areas"; `_through_pair_lines` looks at them)."""
        heard = PAIR_WORDS.unpack_from(self._ctl_bytes[peer], (line + 1) * 8)
        if heard[0] & MARKS:
            return (heard[0] & ~MARKS, *heard[1:])
        return heard

    def _pair_words(self, to: int, turn: int) -> int:
        """The first word, in a rank's control lines, of its pair line to rank `to` for their
        check number `turn`: two lines per peer, by turns (a peer writes turn t+2 only after
        reading turn t)."""
        return (self._pair_line + 2 * to + (turn & 1)) * WORDS

    def _read(self, src: int, address: int, into: Any, dtype: Any, op: ReduceOp | None,
              inbuf: Any | None) -> None:
        """Take the message at `address` in `src`'s memory: copy it into `into` in one go, or
        reduce it a piece at a time through scratch that stays in cache."""
        if op is None:
            self._move(self.memory.read, src, "read rank {}'s message",
                       address, into)
            return
        for _ in self._reduced_pieces(src, address, into, dtype, op, inbuf):
            pass

    def _reduced_pieces(self, src: int, message: int | Any, into: Any, dtype: Any,
                        op: ReduceOp, inbuf: Any) -> Iterator[tuple[int, int]]:
        """into = op(inbuf, src's message) READ_PIECE_BYTES at a time, each piece read into
        scratch that stays in cache (or taken where it lies: `message` is an address in
        src's memory, or a mapping of it); yields each piece's [lo, hi) once reduced."""
        mine = inbuf.view(numpy.uint8)
        # Each piece lands half a page past where it lay in src's page, as a bounce does
        # (`shared_memory._shifted`): read 16 to 31 bytes past it, the 1 MiB pieces of an 8
        # MiB message took 2.1x-2.4x the time, and the scratch's own offset was the heap's to
        # choose. (The add minds no offset.)
        read = isinstance(message, int)
        if read:
            at = half_a_page_from(message, buffer_address(self._scratch))
            scratch = self._scratch[at:at + READ_PIECE_BYTES]
        for lo in range(0, into.size, READ_PIECE_BYTES):
            hi = min(lo + READ_PIECE_BYTES, into.size)
            if read:
                arrived = scratch[:hi - lo]
                self._move(self.memory.read, src, "read rank {}'s message",
                           message + lo, arrived)
            else:
                arrived = message[lo:hi]
            op(mine[lo:hi].view(dtype), arrived.view(dtype), out=into[lo:hi].view(dtype))
            yield lo, hi

    def _give_shared(self, read_by: tuple[int, int], out: Any) -> None:
        """The sender's side of a shared message (see "Shared copies"): once the receiver has
        said where it lands, write our part of `out` there, then say so."""
        dst, seq = read_by
        asked = (self._share_line + self.rank) * WORDS  # in dst's control lines
        theirs = self._ctl[dst]
        self.wait(lambda: theirs[asked] > seq or self._has_taken(dst, seq), dst,
                  "its message to be asked for")
        if theirs[asked] > seq:  # (else the receiver reduced it, reading it all)
            self._move(self.memory.write, dst, "write its message into rank {}",
                       theirs[asked + 1], out[:theirs[asked + WORDS - 1]])
        self._own[(self._share_line + dst) * WORDS + 2] = seq + 1  # our part has landed

    def _take_shared(self, src: int, address: int, into: Any) -> None:
        """The receiver's side of a shared message at `address` in `src`: say where it lands
        and how much of it the sender writes (half), unless `recv_while` asked ahead (the
        whole), read the rest, and wait for the sender's part. (A receiver that reduces a
        message reads it all, `_read`, and the sender sees it taken.)"""
        seq, line = self._taken[src], (self._share_line + src) * WORDS
        if self._own[line] == seq + 1:  # asked ahead (`recv_while`), for `into`
            part = self._own[line + WORDS - 1]
        else:
            part = _sender_part(into.size)
            self._ask(src, buffer_address(into), part)
        written = (self._share_line + self.rank) * WORDS + 2  # in src's control lines
        try:
            if part < into.size:
                self._read(src, address + part, into[part:], into.dtype, None, None)
            self.wait(lambda: self._ctl[src][written] > seq, src, "its part of a message")
        except BaseException:
            # A live sender may still write into `into`: keep its memory from being reused.
            _LENT.append(into)
            raise

    def recv_while(self, buf: Any, src: int, meanwhile: Callable[[], None]) -> None:
        """`recv`, with `meanwhile()` made while a shared message's sender writes it whole
        (see "Shared copies"): the call's pending check first (a sender announces such a
        message only once it has passed), then this rank asks ahead for the whole message,
        makes its work, and takes the message. A sender that does not share it never reads
        the ask; one that shares it writes it all, where it would write half. Without a
        pending check (an unchecked call, or one checked already), `meanwhile()` first, then
        `recv`: the ask would go before anything has compared the message's size. Measured on
        2 ranks in a slow spell, a gather's root took 1.4 ms to copy its own 8 MiB block while
        its peer waited, then 0.7 ms to share the peer's."""
        if self.shares_from is None or self._registered or src == self.rank \
                or self._pending is None or buf.nbytes < self.shares_from:
            super().recv_while(buf, src, meanwhile)
            return
        buf = self._check(buf, src)
        self.checked()
        seq, into = self._taken[src], buf.view(numpy.uint8)
        self._ask(src, buffer_address(into), into.size)
        try:
            meanwhile()
            self.recv(buf, src)
        except BaseException:
            if self._taken[src] == seq:  # not taken: the ask withdrawn, `buf` lent
                self._own[(self._share_line + src) * WORDS] = seq
                _LENT.append(into)  # (a sender may have read the ask)
            raise

    def _ask(self, src: int, address: int, part: int) -> None:
        """Ask `src` to write the first `part` bytes of its next shared message to this rank
        at `address` (here), in our share line for it."""
        line = (self._share_line + src) * WORDS
        self._own[line + WORDS - 1] = part
        self._own[line + 1] = address
        self._own[line] = self._taken[src] + 1  # last: the sender may write now

    def _consumed(self, src: int) -> None:
        """Count one more segment (or direct message) taken from `src`, for it to see."""
        self._taken[src] += 1
        self._own[(CONSUMED + src) * WORDS] = self._taken[src]

    def _has_taken(self, dst: int, seq: int) -> bool:
        """Whether `dst` has taken our segment number `seq` to it."""
        return self._ctl[dst][(CONSUMED + self.rank) * WORDS] > seq

    def _slot_holder(self) -> int | None:
        """The rank that has yet to take what the next slot holds: whom a wait for it waits
        on (not always the rank the next message goes to)."""
        occupant = self._occupant[self._next_slot]
        return None if occupant is None else occupant[0]

    def _slot_free(self) -> bool:
        """Whether the receiver of what the next slot holds has taken it."""
        occupant = self._occupant[self._next_slot]
        return occupant is None or self._has_taken(*occupant)

    def _publish(self, piece: Any, dst: int, nbytes: int) -> None:
        """Copy `piece` (of a message of `nbytes`) into the next slot, then say what it holds."""
        self.memory.copy(self._slots[self.rank][self._next_slot][:piece.size], piece)
        self._announce(dst, nbytes)

    def _announce(self, dst: int, nbytes: int, region: int = 0, offset: int = 0,
                  address: int = 0, shared: bool = False) -> tuple[int, int]:
        """Fill the next slot's line: what it holds for `dst`, of a message of `nbytes`, and
        where the message lies: in registered `region` (numbered from 1) at `offset`, at
        `address` in this process (`shared`: the sender writes part of it, see "Shared
        copies"), or (neither) in the slot. Returns (dst, seq)."""
        j = self._next_slot
        seq = self._sent[dst]
        word = self._slot_words[j]
        own = self._own
        own[word + 1], own[word + 2], own[word + 3], own[word + 4] = nbytes, address, region, \
            offset
        own[word + 5] = int(shared)
        own[word] = (dst + 1) << 48 | seq  # last: the segment is now visible
        self._occupant[j] = (dst, seq)
        self._sent[dst] = seq + 1
        self._next_slot = (j + 1) % SLOTS
        return dst, seq

    def _find(self, src: int) -> int | None:
        """The slot of `src` that holds our next segment from it, or None if none does yet."""
        want = (self.rank + 1) << 48 | self._taken[src]
        ctl, j = self._ctl[src], self._expect[src]
        for _ in range(SLOTS):
            if ctl[self._slot_words[j]] == want:
                self._expect[src] = (j + 1) % SLOTS  # where the next one most likely is
                return j
            j = (j + 1) % SLOTS
        return None

    def _take(self, src: int, into: Any) -> None:
        """Copy our next segment from `src` (of `into`'s size) out of its slot into the flat
        bytes `into`, once it is there, and count it taken."""
        j = self._wait_find(src)
        self._check_size(src, j, into.nbytes)
        self.memory.copy(into, self._slots[src][j][:into.nbytes])
        self._consumed(src)

    def _wait_find(self, src: int) -> int:
        """The slot of `src` that holds our next segment from it, once one does."""
        j = self._find(src)
        while j is None:
            self.wait(lambda: self._find(src) is not None, src, "a segment")
            j = self._find(src)
        return j

    def _check_size(self, src: int, j: int, nbytes: int) -> None:
        sent = self._ctl[src][self._slot_words[j] + 1]
        if sent != nbytes:
            raise MismatchError(f"rank {self.named(self.rank)} expected {nbytes} bytes from rank "
                                f"{self.named(src)} but "
                                f"it sent {sent}"
                                + self.during())

    def _barrier(self) -> None:
        self._barriers += 1
        self._own[BARRIER * WORDS] = self._barriers
        self.wait(lambda: self._everyone(BARRIER, self._barriers), None, "the barrier",
                  late=lambda: self._behind(BARRIER, self._barriers))

    def _behind(self, counter: int, at_least: int) -> list[int]:
        """The ranks whose `counter` has not reached `at_least`."""
        return [r for r, ctl in enumerate(self._ctl) if ctl[counter * WORDS] < at_least]

    def _everyone(self, counter: int, at_least: int) -> bool:
        word = counter * WORDS
        for ctl in self._ctl:
            if ctl[word] < at_least:
                return False
        return True

    def _all_inputs(self, buf: Any, call: tuple[int, ...] | None, reads: Reads | None = None,
                    into: Any | None = None) -> list[Any] | None:
        """Every rank's `buf` through the one-shot areas (`_one_shot_exchange`), or read in
        place at any size; or, larger than an area, the call checked in an area and the data
        the long way."""
        in_place = reads is not None and self.reads_in_place(reads, buf.nbytes)
        if buf.nbytes > self._area_bytes and not in_place:
            if call is not None:
                self._all_inputs(buf[:0], call)
            return self._exchange(buf)
        return self._one_shot_exchange(buf.shape, buf.dtype, reads)(
            buf, call_line(call, buf.nbytes), into)

    def reads_in_place(self, reads: Reads, nbytes: int) -> bool:
        """From `reads_inputs_from` taken of each input of more than `reads_inputs_above`
        bytes (see "Inputs read in place"). (The same on every rank, for the reads that the
        collectives name: a block each of an all-to-all or a reduce-scatter, every input whole
        of an all-gather.)"""
        return self.reads_inputs_from is not None and nbytes > self.reads_inputs_above \
            and min(hi - lo for lo, hi in reads) >= self.reads_inputs_from

    def prepare_all_inputs(self, shape: tuple[int, ...], dtype: Any, collective: str,
                           call: tuple[int, ...] | None, moved: list[Moved] | None = None,
                           reads: Reads | None = None) -> Exchange:
        """The one-shot exchange (`_one_shot_exchange`) with the call's naming, counting and
        call line worked out beforehand (`_prepare_one_shot`): of inputs an area holds, or of
        any size where they are read in place."""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        in_place = reads is not None and self.reads_in_place(reads, nbytes)
        if self.size == 1 or not (0 <= nbytes <= self._area_bytes or in_place):
            return super().prepare_all_inputs(shape, dtype, collective, call, moved, reads)
        return self._prepare_one_shot(shape, dtype, collective, call, moved,
                                      self._one_shot_exchange(shape, dtype, reads), reads)

    def _one_shot_exchange(self, shape: tuple[int, ...], dtype: Any,
                           reads: Reads | None = None) -> Callable[[Any, memoryview], list[Any]]:
        """exchange(buf, line, into): publish `buf` (of `shape` and `dtype`, at most an area)
        and its call line (`call_line`: the call's descriptor or zeros, and the size) in this
        turn's one-shot area, and return every rank's area once each has published;
        CallsDiffer if a descriptor differs. Where each rank names what it takes of each input
        (`reads`), and that is `reads_inputs_from` or more, the inputs are read in place
        instead, at any size (`_new_exchange_in_place`).

        The areas alternate between turns. Reusing one is safe without asking: a peer
        publishes turn t-1 only after reading turn t-2, and we saw every peer's turn t-1.
        Small calls come often, so what does not depend on the data (every rank's view of
        both areas, the lines) is worked out here, once per shape and dtype, and kept; the
        call lines are compared as words. (At 8 B the exchange's Python is most of its time:
        with a peer always ready, 1.6 us, where lines of bytes, the peers' list with this
        rank's own lines, and calls for the copy and for `settle` took 1.9.)
        """
        if reads is not None:  # (few exchanges name reads)
            nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
            by_address, least = self.reads_in_place(reads, nbytes), self.references_from
            shares = self.shares_inputs_from is not None and nbytes >= self.shares_inputs_from
            if by_address or shares or self._registered and least is not None \
                    and nbytes >= least:
                return kept(self._exchanges, (shape, dtype, reads, by_address), KEPT_EXCHANGES,
                            lambda: self._new_exchange_in_place(shape, dtype, reads,
                                                                by_address))
        return kept(self._exchanges, (shape, dtype), KEPT_EXCHANGES,
                    lambda: self._new_one_shot_exchange(shape, dtype))

    def _new_one_shot_exchange(self, shape: tuple[int, ...],
                               dtype: Any) -> Callable[[Any, memoryview], list[Any]]:
        """`_one_shot_exchange`, made. (Its `into` is placed by its caller, out of the areas
        it returns: `_prepare_one_shot`, `all_inputs`.)"""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        areas = [[d[lo:lo + nbytes].view(dtype).reshape(shape) for d in self._data]
                 for lo in (SLOTS * self.slot_bytes + area * self._area_bytes
                            for area in range(2))]
        own, lines, rank = self._own, self._call_lines, self.rank
        peers = [ctl for r, ctl in enumerate(self._ctl) if r != rank]
        ours = [inputs[rank] for inputs in areas]
        settle, copy = self.memory.settle, self.memory.copy
        # Host memory (the data in the host regions): a copy is a store, and reads of peers'
        # areas end as they return. (At 8 B each call of a function shows.)
        host = self.memory.in_host_region
        # Of a flat byte input (a scatter's description), only the first bytes that peers
        # take (`unread`) are copied.
        in_part = host and len(shape) == 1 and numpy.dtype(dtype) == numpy.uint8
        word = PUBLISHED * WORDS

        def exchange(buf: Any, line: memoryview, into: Any | None = None) -> list[Any]:
            if not host:
                settle()  # the previous turn's reads of peers' areas are done
            self._one_shots = turn = self._one_shots + 1
            after, self._unread_after = self._unread_after, None  # (`unread`)
            if after == 0:  # none takes it: our area keeps what it held
                pass
            elif after is not None and in_part:  # none takes what follows its first bytes
                ours[turn & 1][:after] = buf[:after]
            elif host:
                ours[turn & 1][...] = buf
            elif nbytes:
                copy(ours[turn & 1], buf)
            mine, theirs = lines[turn & 1]
            mine[:] = line
            own[word] = turn  # last: the area and its line are now visible
            for peer in peers:
                if peer[word] < turn:
                    polls = self.spin
                    while peer[word] < turn:  # a short spin first: a peer is most often about to
                        if not polls:
                            self._wait_published(peer, turn)
                            break
                        polls -= 1
            for their_line in theirs:
                if their_line != mine:
                    self._answer_messages(line, theirs)
                    self._compare_lines(line, theirs)  # raises
            return areas[turn & 1]

        return exchange

    def _new_exchange_in_place(self, shape: tuple[int, ...], dtype: Any, reads: Reads,
                               by_address: bool) -> Callable[[Any, memoryview], list[Any]]:
        """`_one_shot_exchange` of inputs read in place (see "Inputs read in place"): publish
        the call line and where `buf` lies; once every peer's has come and agrees, read the
        bytes `reads` names of each peer's input straight out of its memory, copy those of our
        own, say so, and return once every peer has said so too (they read `buf`). The bytes
        land in `into` where it is given (`prepare_all_inputs`), and the exchange returns
        None; else in scratch, returned as every rank's input (holding only the bytes `reads`
        names): an area's worth a rank, kept, or for an input larger than an area (read in
        place at any size), its own size a rank, for the call. An input that its owner put in
        its area instead (`InputRoad`) is returned as that area, not copied out: as the areas
        of any one-shot exchange, it stays until this rank's next exchange. Measured on 2
        ranks (docs/performance.md, "Reduced straight out of the areas"), a 1 MiB
        reduce-scatter took 41-46 us where the copy out made it take 61-67.

        Not `by_address` (a call that names its reads, below `reads_inputs_from`), only inputs
        in registered memory, shared ones and those left in place are read where they lie,
        and their owners wait for their readers (see "Registered memory", "Shared inputs").
        Each of the others is copied into its owner's area, as `_new_one_shot_exchange` does,
        and read from there: into `into`, or where none is given, not at all (the area itself
        is returned as that rank's input).

        On two ranks from SHARED_BYTES, an owner that takes nothing shares its input with a
        reader that asks (see "Shared inputs"), and one that takes its peer's whole input too
        (an all-reduce's) leaves its own where it lies above LEFT_BYTES (or, where an area
        holds it, puts it there while `InputRoad` says so)."""
        nbytes = math.prod(shape) * numpy.dtype(dtype).itemsize
        rank, size = self.rank, self.size
        stride = max(self._area_bytes, nbytes)  # between two ranks' inputs in scratch

        def made_scratch() -> tuple[Any, list[Any]]:
            if nbytes > self._area_bytes:
                scratch = numpy.empty(size * stride, numpy.uint8)
            else:
                if self._inputs_read is None:
                    self._inputs_read = numpy.empty(size * stride, numpy.uint8)
                scratch = self._inputs_read
            return scratch, [scratch[r * stride:][:nbytes].view(dtype).reshape(shape)
                             for r in range(size)]
        kept_scratch = made_scratch() if nbytes <= self._area_bytes else None
        # Each rank's bytes: (rank, lo, length, where they land: from the first byte of `into`,
        # its block r, and of scratch). The copies and reads go by address: a view of each
        # place would cost a call more than its read's own Python.
        landing = [(r, lo, hi - lo, (r * (hi - lo), r * stride + lo))
                   for r, (lo, hi) in enumerate(reads) if lo < hi]
        ours = [(lo, length, at) for r, lo, length, at in landing if r == rank]
        wanted = [(r, lo, length, at, "read rank {}'s input")
                  for r, lo, length, at in landing if r != rank]
        # What this rank takes of its peers' inputs, for its `InputRoad` (below).
        taken = sum(length for _, _, length, _, _ in wanted)
        # Through its area, an input's owner copies what its peers take: all of it, where
        # each takes every input whole (an all-gather); else all but the block it takes of
        # each itself, the others' own blocks (an all-to-all's, a reduce-scatter's).
        own_lo, own_hi = reads[rank]
        spans = [(0, nbytes)] if (own_lo, own_hi) == (0, nbytes) else \
            [(lo, hi - lo) for lo, hi in ((0, own_lo), (own_hi, nbytes)) if lo < hi]
        copied = sum(length for _, length in spans)
        # Every rank's area of each turn's parity: where it lies here, and as its input (read
        # in place, an owner whose area holds its input may still put it there: `road`; its
        # readers follow it, whatever their own roads).
        areas_at, areas = [[], []], [[], []]
        if not by_address or nbytes <= self._area_bytes:
            for parity in range(2):
                lo = SLOTS * self.slot_bytes + parity * self._area_bytes
                areas_at[parity] = [d.ctypes.data + lo for d in self._data]
                areas[parity] = [d[lo:lo + nbytes].view(dtype).reshape(shape) for d in self._data]
        address = [(self._call_line + area) * WORDS + CALL_WORDS + 1 for area in range(2)]
        own, lines = self._own, self._call_lines
        peers = [ctl for r, ctl in enumerate(self._ctl) if r != rank]
        registered = self._registered_at  # (a list: regions registered later count too)
        # A rank that takes one input only may give `into` of that one block: it lands there.
        alone_length, alone_at = (landing[0][2], landing[0][3][0]) if len(landing) == 1 \
            else (-1, 0)
        # Shared inputs (two ranks): an owner that takes nothing, whose reader copies its
        # input whole (`copied_whole`), may offer to write half of it, when `Sharing` says;
        # a reader that takes its peer's whole input, into place, asks.
        shares = self.shares_inputs_from is not None and nbytes >= self.shares_inputs_from
        offers = shares and not landing
        asker = wanted[0] if shares and len(landing) == 1 and wanted \
            and wanted[0][2] == nbytes else None
        # On two ranks, an owner that takes its peer's whole input (an all-reduce's), of more
        # than LEFT_BYTES, leaves its own where it lies for its peer to read directly, while
        # it reads the peer's (see "Shared inputs"). (Other readers, which take a part of
        # each input, read in place from `reads_inputs_from`, as they did.)
        leaves = asker is not None and nbytes > LEFT_BYTES
        # Read in place, or left where it lies, an input that an area holds goes by the road
        # measured cheaper where every rank has a core (`InputRoad`).
        road = InputRoad(copied, taken) if (by_address or leaves) and self.roads is not None \
            and self.input_roads and 0 < nbytes <= self._area_bytes and taken and copied \
            else None
        sharing = self.sharing
        # An owner that takes nothing of an input that its reader reduces (a reduce's other
        # rank's) leaves it where it lies, or puts it in its area, by the road it measures
        # cheaper where every rank has a core (`LeftRoad`).
        left_road = LeftRoad() if offers and self.roads is not None else None
        # On two ranks, an all-gather's inputs (each rank places its own and takes its peer's
        # whole) of PUSHED_BYTES or more may be written by their owners instead, by the road
        # both measure cheaper (`PushRoad`, see "Pushed inputs").
        push_road = PushRoad() if shares and road is None and self.roads is not None \
            and nbytes >= PUSHED_BYTES and len(landing) == 2 and wanted[0][2] == nbytes \
            else None
        # What a shared input's owner writes: half, more where its reader has work meanwhile,
        # or all of it, pushed.
        parts = {eighths: _sender_part(nbytes, eighths)
                 for eighths in (4, ALONGSIDE_EIGHTHS, 8)}
        peer = (rank + 1) % size  # (the only one, where inputs are shared)
        share = (self._share_line + peer) * WORDS  # our share line for it: words 4 to 6
        shared = (self._share_line + rank) * WORDS  # its for us, in its control lines

        def exchange(buf: Any, line: memoryview, into: Any | None = None) -> Any:
            self._one_shots = turn = self._one_shots + 1
            parity = turn & 1
            mine, their_lines = lines[parity]
            mine[:] = line
            ours_at = buffer_address(buf)
            into_at = None if into is None else buffer_address(into)
            word = self._address_word(buf) if registered else ours_at
            unread = self._unread_after == 0  # (some of it taken: all of it moves)
            self._unread_after = None
            whole, self._copied_whole = self._copied_whole, False
            keeps, self._keeps_own = self._keeps_own, False
            alongside, self._alongside = self._alongside, None
            gauged = offers and whole and not word & REGISTERED  # (`Sharing` chooses)
            through_area = road is not None and road.takes_first() and not word & REGISTERED
            chosen = left_road is not None and not whole and not unread and not by_address \
                and not word & REGISTERED
            # (Every rank of an all-gather gives `into`: all count the call, and push alike.)
            pushes = push_road is not None and into is not None and push_road.takes_first()
            left = chosen and left_road.leaves()
            began = time.perf_counter() if chosen else 0.0
            overlaps = into_at is not None and into_at < ours_at + nbytes \
                and ours_at < into_at + into.nbytes  # (what lands would change ours)
            if unread:  # none takes it: nothing to say where it lies, none to wait for
                word = 0
            elif gauged and sharing.shares():
                word |= SHARED  # read where it lies, half of it written by us if asked
            elif pushes and not word & REGISTERED:
                word |= SHARED  # written by us, where our reader asks
            elif through_area:  # (the copy timed for `InputRoad`)
                started, area_at = time.perf_counter(), areas_at[parity][rank]
                for lo, length in spans:
                    ctypes.memmove(area_at + lo, ours_at + lo, length)
                road.took("in", time.perf_counter() - started, copied)
                word = 0
            elif gauged or not by_address and not left and (
                    overlaps or not word & REGISTERED and not leaves):
                # Through our area (where we place what we take over `buf` too): none waits.
                copying = time.perf_counter()
                ctypes.memmove(areas_at[parity][rank], ours_at, nbytes)
                if gauged:  # (the copy timed for `Sharing`)
                    sharing.took(time.perf_counter() - copying, nbytes)
                word = 0
            if into is not None and into.nbytes == alone_length:
                into_at -= alone_at  # (so that its one block lands at its start)
            asks = (asker is not None or pushes) and into is not None
            eighths = 8 if pushes else ALONGSIDE_EIGHTHS if alongside is not None else 4
            if asks:  # where the input we take lands, and how much of it its owner writes
                own[share + 5] = into_at + wanted[0][3][0] | eighths << LANDING_BITS
                own[share + 4] = turn
            own[address[parity]] = word
            own[VOTES + parity] = road.prefers_area() if road is not None else \
                push_road is not None and push_road.prefers_writes()
            own[PUBLISHED * WORDS] = turn  # last: the line, the address and the vote are visible
            try:
                inputs = take(buf, line, into, turn, parity, mine, their_lines, ours_at, into_at,
                              word, unread, asks, alongside, parts[eighths],
                              keeps and into is None, pushes)
                if chosen:  # (left: once its reader has read it)
                    left_road.took("place" if left else "area", time.perf_counter() - began,
                                   nbytes)
                return inputs
            except BaseException as error:
                if asks and own[share + 4] == turn:  # withdrawn
                    own[share + 4] = 0
                    if not isinstance(error, MismatchError):  # (else the owner writes nothing)
                        _LENT.append(into)  # a live owner may still write into it
                raise

        def take(buf: Any, line: memoryview, into: Any | None, turn: int, parity: int,
                 mine: memoryview, their_lines: list[memoryview], ours_at: int,
                 into_at: int | None, word: int, unread: bool, asks: bool,
                 alongside: Callable[[], None] | None, part: int, kept: bool,
                 pushes: bool) -> Any:
            """The exchange once this rank has published: wait for the peers, then move (and
            make `alongside` before reading, while a shared input's owner writes `part`); our
            own bytes not at all where the caller keeps them (`kept`: `keeps_own`). Where the
            inputs are pushed, ours is written once its own block is placed."""
            for ctl in peers:
                if ctl[PUBLISHED * WORDS] < turn:
                    self._wait_published(ctl, turn)
            for their_line in their_lines:
                if their_line != mine:
                    self._answer_messages(line, their_lines)
                    self._compare_lines(line, their_lines)  # raises, nothing taken
            timed = push_road if into is not None else None  # (the call, from here on)
            voted = road or timed
            if voted is not None:
                voted.heard(ctl[VOTES + parity] for ctl in self._ctl)
            come = time.perf_counter()  # (every rank has)
            asked = word & SHARED and self._ctl[peer][shared + 4] == turn  # by our reader
            if asked and not pushes:
                write_ours(ours_at, turn)
            inputs = None
            if into is None:
                scratch, scratched = kept_scratch or made_scratch()
                inputs = list(scratched) if by_address else list(areas[parity])
            where = 1 if into is None else 0
            base = buffer_address(scratch) if into is None else into_at
            for lo, length, at in ours:
                # (Not where our area holds it as it is, nor where the caller takes its own
                # bytes from its input itself: `kept`, `keeps_own`.)
                if (word or unread or into is not None or road is not None) and not kept:
                    ctypes.memmove(base + at[where], ours_at + lo, length)
                    if inputs is not None:
                        inputs[rank] = scratched[rank]
            if asked and pushes:  # from our block just placed, still in the caches
                write_ours(base + ours[0][2][0], turn)
            if alongside is not None:
                alongside()
            for r, lo, length, at, what in wanted:
                theirs = self._ctl[r][address[parity]]
                if not theirs:  # in its area: returned as it is, unless placed
                    if into is None:  # (its caller works straight out of the area)
                        inputs[r] = areas[parity][r]
                    else:
                        started = time.perf_counter()
                        ctypes.memmove(base + at[where], areas_at[parity][r] + lo, length)
                        if road is not None:
                            road.took("out", time.perf_counter() - started, length)
                    continue
                if theirs & REGISTERED:
                    ctypes.memmove(base + at[where], self._mapped(r, theirs) + lo, length)
                elif theirs & SHARED and asks:  # all but the part its owner writes
                    if length > part:  # (pushed: the last bytes of a line, if any)
                        self._move(read_peer_bytes, r, what, theirs - SHARED + lo + part,
                                   base + at[where] + part, length - part)
                    if self._ctl[r][shared + 6] < turn:
                        self.wait(lambda: self._ctl[r][shared + 6] >= turn, r,
                                  "its part of an input")
                else:
                    started = time.perf_counter()
                    self._move(read_peer_bytes, r, what, (theirs & ~SHARED) + lo,
                               base + at[where], length)
                    if road is not None:
                        road.took("read", time.perf_counter() - started, length)
                if inputs is not None:
                    inputs[r] = scratched[r]
            if asks:
                own[share + 4] = 0  # (the owner has written its part, or will write none)
            own[READ * WORDS] = turn
            if word and not self._everyone(READ, turn):
                self.wait(lambda: self._everyone(READ, turn), None, "its input to be read",
                          late=lambda: self._behind(READ, turn))
            if timed is not None and not word & REGISTERED:  # (registered: read, whatever)
                timed.took("write" if pushes else "read", time.perf_counter() - come, nbytes)
            return inputs

        def write_ours(source: int, turn: int) -> None:
            """Write the part of our input that our reader asked for in `turn`, from `source`
            (our input, or its copy placed in our result), where it lands in its memory."""
            landing = self._ctl[peer][shared + 5]
            self._move(write_peer_bytes, peer, "write its input into rank {}",
                       landing & (1 << LANDING_BITS) - 1, source,
                       _sender_part(nbytes, landing >> LANDING_BITS))
            own[share + 6] = turn  # our part has landed

        return exchange

    def _answer_messages(self, line: memoryview, theirs: list[Any]) -> None:
        """Before a collective raises because a peer's call line is a message's check (the
        peer is in a send or a recv with this rank: `_answer_collective`), answer that check
        with this call's descriptor (our call `line`), so that the peer raises too, and both
        have taken each other's turn."""
        words = tuple(line[:CALL_WORDS])
        for peer, their_line in zip((r for r in range(self.size) if r != self.rank), theirs):
            if their_line[0] != MESSAGES:
                continue
            turn = self._pairs[peer] + 1
            if self._ctl[peer][self._pair_words(self.rank, turn)] == turn:
                self._pairs[peer] = turn
                at = self._pair_words(peer, turn)
                PAIR_WORDS.pack_into(self._ctl_bytes[self.rank], (at + 1) * 8, *words)
                self._own[at] = turn  # last: the words are now visible

    def _answer_collective(self, peer: int, words: tuple[int, ...], line: int, turn: int,
                           answered: list[int]) -> bool:
        """Whether `peer`'s pair line at `line` has come for `turn`, while a message's check
        (`say_pairs`, our `words`) waits for it. Meanwhile, if `peer` has published a
        one-shot turn that this rank has not, it is in a collective call: publish that turn
        too, once (`answered`), with the check's words as our call line, so that the peer
        raises, having answered the check (`_answer_messages`). The pair line is read again
        after the turn: a peer that came to the message and then went on to a collective
        wrote it first."""
        theirs = self._ctl[peer]
        if theirs[line] == turn:
            return True
        if not answered and theirs[PUBLISHED * WORDS] > self._one_shots \
                and theirs[line] != turn:
            self.memory.settle()
            self._one_shots = published = self._one_shots + 1
            self._call_lines[published & 1][0][:] = call_line(words, 0)
            self._own[PUBLISHED * WORDS] = published  # last: the line is now visible
            answered.append(published)
        return False

    def _wait_published(self, peer: memoryview, turn: int) -> None:
        """Wait until the `peer` control lines have published `turn` (`wait` names who has not,
        if none comes)."""
        word = PUBLISHED * WORDS
        self.wait(lambda: peer[word] >= turn, None, "one-shot inputs",
                  late=lambda: self._behind(PUBLISHED, turn))

    def register(self, nbytes: int) -> Any:
        """`nbytes` in a new region that every peer maps (see "Registered memory"), rounded up
        to whole pages; in host memory only (elsewhere an ordinary allocation). Collective:
        every rank asks for the same size, which its caller has agreed in a call that times out
        (`Communicator.empty`), and the region lives until `close`."""
        if not self.memory.in_host_region:
            return super().register(nbytes)
        regions = share_regions(self.comm, max(PAGE, -(-nbytes // PAGE) * PAGE))
        own = regions[self.rank]
        self._registered.append(regions)
        self._registered_at.append((own.ctypes.data, own.ctypes.data + own.size))
        self._mapped_at.append([region.ctypes.data for region in regions])
        return own[:nbytes]

    # ---- one-sided moves ---------------------------------------------------------------------

    def locate(self, buf: Any) -> int:
        """`Transport.locate`: `buf`'s address word (`_address_word`: in registered memory, its
        region and offset, which a peer copies from out of its own mapping)."""
        return self._address_word(buf) if self._registered else buffer_address(buf)

    def get(self, peer: int, where: int, offset: int, into: Any) -> None:
        """`Transport.get`: copied out of our mapping of `peer`'s registered region, or read
        by the kernel (`process_vm_readv`)."""
        if not into.nbytes:
            return
        if where & REGISTERED:
            ctypes.memmove(buffer_address(into), self._mapped(peer, where) + offset, into.nbytes)
        else:
            self._move(self.memory.read, peer, "read rank {}'s block", where + offset, into)

    def put(self, peer: int, address: int, data: Any) -> None:
        """`Transport.put`: written by the kernel (`process_vm_writev`), registered memory too
        (our mappings of peers' regions are read-only)."""
        if data.nbytes:
            self._move(self.memory.write, peer, "write into rank {}'s buffer", address, data)

    def _region_of(self, buf: Any) -> tuple[int, int] | None:
        """(region, offset) of `buf` if it lies in registered memory (regions from 1)."""
        word = self._address_word(buf)
        if not word & REGISTERED:
            return None
        return (word & ~REGISTERED) >> OFFSET_BITS, word & OFFSET_MASK

    def _address_word(self, buf: Any) -> int:
        """Where the contiguous `buf` lies, for a peer to read it in place: its address, or,
        in registered memory, its region and offset marked REGISTERED."""
        start = buffer_address(buf)
        for region, (lo, hi) in enumerate(self._registered_at, start=1):
            if lo <= start and start + buf.nbytes <= hi:
                return REGISTERED | region << OFFSET_BITS | start - lo
        return start

    def _mapped(self, src: int, word: int) -> int:
        """Where the bytes that `src`'s address `word` marked REGISTERED names lie here: in our
        mapping of its region (`_address_word`). Copied from there at memory speed, where a
        direct read is a system call and two to three times a copy's time a byte here."""
        region, offset = (word & ~REGISTERED) >> OFFSET_BITS, word & OFFSET_MASK
        return self._mapped_at[region - 1][src] + offset

    def _check_peer(self, peer: int | None, thorough: bool = False) -> None:
        if self._pids is None:
            return
        self._checks += 1
        # A zombie's state is a file to read: now and then in a long wait, and where a move
        # from the peer's memory failed.
        thorough = thorough or self._checks % 64 == 0
        for r in range(self.size) if peer is None else (peer,):
            if r != self.rank and not _alive(self._pids[r], thorough):
                raise PeerFailedError(f"rank {self.named(self.rank)}: rank {self.named(r)} (pid "
                                      f"{self._pids[r]}) has died"
                                      + self.during())

    def close(self) -> None:
        if not self.closed:
            # Drop our views; each mapping goes when its last view does (or at exit).
            self._ctl, self._own, self._data, self._slots = [], None, [], []
            self._exchanges = {}
            self._registered, self._registered_at, self._ctl_bytes = [], [], []
            self._mapped_at = []
            self._call_lines, self._pair_out, self._pair_in = [], None, None
            if not MPI.Is_finalized():
                self.comm.Free()
        super().close()
