"""Serves one processor class over ASGI: ``python -m runtime serve module:Class``."""
