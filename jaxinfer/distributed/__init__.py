"""Where arrays live on a mesh and how several processes run one model: `sharding` (the one
logical-axis to mesh-axis map), `multihost` (``jax.distributed`` start-up and the SPMD step
protocol), `step_channel` (the leader's step stream) and `peer_failure` (one failing process
ends them all).
"""
