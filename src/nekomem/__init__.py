"""nekomem: a local memory server for AI companion characters."""

__version__ = "0.1.0"
