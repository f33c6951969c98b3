"""The project's version: the one place it is written (pyproject.toml and the image read it from here).

A constant rather than a lookup in the installed metadata: importlib.metadata costs every
process of the stack about 2 MB and 10 ms of start-up to learn one string.
"""

VERSION = "0.1.0"
