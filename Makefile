# Development shortcuts, run inside the virtual environment of the README's test command
# (`pip install '.[test]'`). .ci/run stays CI's one entry and the one list of its steps: `make ci` runs it,
# and every other target runs one of its steps with the same command (tests/unit/test_makefile.py holds
# each recipe line to a line of .ci/run). `make test-fast` is the unit tests alone, the loop between edits.

.PHONY: help lint test-fast test deploy image conformance dra cluster nfd cdi prometheus bench ci

help:
	@echo "make lint         ruff and mypy, as CI runs them"
	@echo "make test-fast    the unit tests alone (python -m pytest -m unit -n auto)"
	@echo "make test         the README's test command: unit, deployment and integration tests"
	@echo "make deploy       the chart and the image recipe with the real tools (deploy/validate.sh)"
	@echo "make image        the image built and run on Docker (deploy/image_test.sh)"
	@echo "make conformance  the real kubelet's device manager (Go, root)"
	@echo "make dra          a real API server and the kubelet's DRA manager (Go)"
	@echo "make cluster      the chart and the image on a one-node cluster from source, both modes (Go, root)"
	@echo "make nfd          the real Node Feature Discovery (Go, root)"
	@echo "make cdi          the CDI reference library (Go)"
	@echo "make prometheus   a real Prometheus server scrapes the stack (needs prometheus on PATH)"
	@echo "make bench        the benchmarks in quick mode"
	@echo "make ci           everything CI runs: .ci/run, in a fresh virtual environment"

lint:
	ruff check .
	mypy

test-fast:
	python -m pytest -m unit -n auto

test:
	python -m pytest

deploy:
	bash deploy/validate.sh

image:
	bash deploy/image_test.sh

conformance:
	bash tests/conformance/run.sh

dra:
	bash tests/dra/run.sh

cluster:
	bash tests/cluster/run.sh

nfd:
	bash tests/nfd/run.sh

cdi:
	bash tests/cdi/run.sh

prometheus:
	python -m pytest tests/integration/prometheus_check.py

bench:
	python bench/run.py --quick || echo "benchmarks did not complete (not a CI failure)"

ci:
	bash .ci/run
