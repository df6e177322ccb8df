"""securefed: privacy-hardened federated recommendation."""

__version__ = "0.1.0"
