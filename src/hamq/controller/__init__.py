"""Sans-IO controller core (seed 001): RocketMQ 5's ``ReplicasInfoManager`` as a state machine.

Requests are *decided* against the state (read-only, on the Raft leader) into events; events
are *applied* in Raft log order on every controller peer. Nothing here touches sockets,
clocks or files: liveness and time come in as arguments, so every peer that applies the same
events ends in the same state.
"""
