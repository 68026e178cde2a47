"""Ferry's device agent."""

__version__ = "0.1.0"
