"""Fixtures for the twin's tests (helpers live in twin_helpers.py)."""

from twin_helpers import twin_factory

__all__ = ["twin_factory"]
