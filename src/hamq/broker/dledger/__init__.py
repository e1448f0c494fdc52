"""The DLedger commit log (seed 002): a broker group's Raft log holds its send batches.

Split by job so each part can be used on its own: ``wire`` (entry and Raft-message codec,
no asyncio), ``grouping`` (which proposals share an entry), ``core`` (the synchronous
Ready processing, driven by the broker and by the simulator alike) and ``driver`` (the
asyncio shell: ticks, worker threads, the member-to-member transport). Nothing is
imported here, so ``hamq.broker.dledger.wire`` loads without the event loop.
"""
