"""Federated recommenders: FedRAP and FedRecGEL."""
