# make train: set up .venv if needed, then train PPO on CartPole-v1 (about a minute on 2 CPU cores)
# make test:  set up .venv if needed, then lint and run the test suite
VENV ?= .venv
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

.PHONY: train test
train: $(VENV)/.installed
	$(VENV)/bin/jaxrl-frag train ppo --env CartPole-v1

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest
