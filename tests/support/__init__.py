"""Shared test support (importable as ``support``: pyproject sets ``pythonpath = ["tests"]``).

Fixtures' engines, brokers, databases, running services and the AST helper live here, once.
"""
