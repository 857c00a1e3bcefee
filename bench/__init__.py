"""Benchmarks (`radixserve bench <name>`): scripts that print tables, not tests."""
