"""phasegate: drive coding agents through a contract-checked ticket lifecycle."""

__version__ = "0.1.0"
