"""The scheduler service: the engine's batching loop behind long-lived batch streams."""
