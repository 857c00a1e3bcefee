"""The gateway: the public radixserve.v1.GenerateService in front of the internal services."""
