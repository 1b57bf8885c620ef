"""gir's version: a leaf, so that cache keys and `gir --version` read it without importing gir."""

__version__ = "0.1.0"
