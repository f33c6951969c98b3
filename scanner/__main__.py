"""`python -m scanner`: the scanner process."""

from shared.fence import loguru_asyncio

# Before anything imports loguru (shared/fence/loguru_asyncio.py): the scanner never needs asyncio.
loguru_asyncio.install()

from scanner.main import main  # noqa: E402

# The console script (pyproject.toml) names this module's `main`, so that it too comes in after install().
if __name__ == "__main__":
    main()
