"""The installed version of the project."""

from importlib import metadata

try:
    VERSION = metadata.version("rbln-device-plugin")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+source"
