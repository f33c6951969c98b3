"""`python -m dra_worker`: the dra worker process."""

from dra_worker.main import main

main()
