"""Request routing over data-parallel scheduler replicas."""
