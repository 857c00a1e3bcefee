"""Pieces every radixserve service shares: errors, gRPC options, health, lifecycle."""
