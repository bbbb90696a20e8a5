# commbench: `make run` sets up and runs the default study; `make test` sets up and runs the tests.
NP ?= 8
VENV ?= .venv
ARGS ?=

.PHONY: setup run test lint clean docker-image

setup:
	./scripts/setup.sh

run: setup
	$(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) $(VENV)/bin/python -m commbench.allreduce $(ARGS)

test:
	./scripts/setup.sh --with-test-deps
	$(VENV)/bin/python -m pytest -q --durations=30

docker-image: setup
	docker/build.sh --local-base

lint:
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache
