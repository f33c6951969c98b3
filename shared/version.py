"""The project's version. pyproject.toml (through hatchling) and the image Makefile read it from here;
the Dockerfile's default VERSION and the chart's appVersion repeat it, and tests keep them equal.

A constant rather than a lookup in the installed metadata: importlib.metadata costs every
process of the stack about 2 MB and 10 ms of start-up to learn one string.
"""

VERSION = "0.1.0"
