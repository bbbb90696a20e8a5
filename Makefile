# commbench: `make run` sets up and runs the default study; `make test` sets up and runs the tests.
NP ?= 8
VENV ?= .venv
ARGS ?=

.PHONY: setup run test check lint clean docker-image

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) $(VENV)/bin/python -m commbench.allreduce $(ARGS)

test:
	./scripts/setup.sh --with-test-deps
	$(VENV)/bin/python -m pytest -q --durations=30

# the edit loop (~3 min here): every test that starts no process, plus one job per launcher
# and every tool's bad input (tests/tiers.py); make test runs everything
check: setup
	$(VENV)/bin/python -m pytest -q -m "not job or check" --durations=10

docker-image: setup
	docker/build.sh --local-base

lint:
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache
