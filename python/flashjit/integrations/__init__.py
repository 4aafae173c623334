"""Integrations of flashjit with other libraries (each imports its own)."""
