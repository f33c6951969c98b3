"""`python -m resource_worker`: the resource worker process."""

from resource_worker.main import main

# The console script (pyproject.toml) names this module's `main`, as it does the scanner's.
if __name__ == "__main__":
    main()
