from shared import loguru_asyncio

# Before anything imports loguru (shared/loguru_asyncio.py): a worker whose resource has no devices never
# needs asyncio; one that serves gets it with gRPC.
loguru_asyncio.install()

from resource_worker.main import main  # noqa: E402

main()
