"""Batched federated simulation: cohort sampling, the round loop and aggregation."""
