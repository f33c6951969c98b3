"""`python -m resource_worker`: the resource worker process."""

from shared.fence import loguru_asyncio

# Before anything imports loguru (shared/fence/loguru_asyncio.py): a worker whose resource has no devices never
# needs asyncio; one that serves gets it with gRPC.
loguru_asyncio.install()

from resource_worker.main import main  # noqa: E402

# The console script (pyproject.toml) names this module's `main`, so that it too comes in after install().
if __name__ == "__main__":
    main()
