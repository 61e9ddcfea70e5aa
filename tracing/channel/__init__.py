"""The multi-node channel: transport, not judgement. Each node's launcher offers a snapshot of its
processes (``node_snapshot``: one msgspec schema, validated on receipt) over the launch's own
rendezvous store (``relay``); ``crossnode`` runs the exchange and merges what node 0 receives into
its ``RunView``, where ``verdicts`` judges it like the node's own."""
