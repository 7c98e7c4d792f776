"""What runs every algorithm: plans as data (:mod:`.plan`), the engine that runs them
(:mod:`.engine`), the per-communicator context with its workspace and reduction
(:mod:`.executor`), how vectors are cut (:mod:`.layout`), the one collective that makes bad
arguments fail on every rank (:mod:`.agreement`), the one copy between vectors and boxes
(:mod:`.copies`), the rounds over the node's boxes (:mod:`.posted`) and the transports that
move the messages (:mod:`.transports`)."""
