"""Tensor parallelism over the ranks of one engine: rank 0 (`launch.TPLeader`, inside EngineCore)
spawns the followers (`worker`), sends each step's plan (`plan`) over a control channel, and
watches them; the layers' collectives go through `radixserve.engine.distributed`."""
