"""Helpers and fixtures the test suites share. Test modules import from here, never from one another
(tests/unit/test_test_imports.py holds them to it)."""
