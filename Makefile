# make train: set up .venv if needed (15-20 s on a fresh machine with uv, 90 s with pip), then train PPO on CartPole-v1
#             (10-15 s on 2 CPU cores)
# make test:  set up .venv if needed, then lint, build the API reference (strict) and run the test suite but for
#             the longest learning runs (once the compilation cache holds the suite's programs: 8 to 10 minutes on
#             2 AMD EPYC cores, 13 to 14 on 2 Intel Xeon cores; see tests/conftest.py and the suite times in benchmarks/RESULTS.md)
# make test-long: the longest runs (marked long: Atari, Gymnasium, SMAX, Brax, the multi-process actor-learner and
#             host-environment runs, those on a Ray cluster); not in CI (.ci/run runs make test): run it before
#             landing a change to what they prove (docs/testing.md)
# make test-fast: the unit and equivalence tests only, no learning thresholds, no real processes, nor the programs
#             costliest to compile (of the recipe x policy matrix only PPO's, DQN's and MAPPO's exact rows; no SMAX,
#             nor boosting's rungs): 2.6 to 3 minutes on 2 AMD EPYC cores once the compilation cache holds their
#             programs, 5.5 from empty
# make docs:  set up .venv if needed, then build the API reference into site/ (open site/index.html)
VENV ?= .venv
PYTHON ?= python3
# pytest-xdist workers, each a whole module at a time (the compilation cache is shared); TEST_WORKERS=0: one process;
# each suite ends with its 25 slowest tests, for whoever plans the next cut in its time
TEST_WORKERS ?= 2
PYTEST = $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# installed by uv (pip's resolver and downloads, one at a time, take 4 to 5 times as long from an empty cache),
# trusting the system's certificates as pip does, or by pip where uv cannot install
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q uv && $(VENV)/bin/uv pip install -q --system-certs --python $(VENV)/bin/python \
		--upgrade pip -e '.[dev]' \
		|| $(VENV)/bin/pip install -q --upgrade pip -e '.[dev]'
	touch $@

.PHONY: train test test-long test-fast docs
train: $(VENV)/.installed
	$(VENV)/bin/jaxrl-frag train ppo --env CartPole-v1

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(MAKE) docs
	$(PYTEST) -m "not long"

# a few long tests, two of them in one module: spread test by test
test-long: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m long --durations=25

test-fast: $(VENV)/.installed
	$(PYTEST) -m "not slow and not learning and not long"

# strict: a warning (a docstring griffe cannot parse, a broken cross-reference, a missing name) fails the build
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d site
