# The two commands of the README. Each creates (or updates, when pyproject.toml changed) the
# virtual environment .venv on first use, so a fresh clone needs nothing else.
#   make repro   the main job: `dvc repro` of every stage on params.yaml (smoke profile, offline),
#                after a preflight of everything the profile needs (python -m pipelines.preflight)
#   make test    the tests, exactly as CI (.ci/run) runs them
PYTHON ?= python3.11
VENV := .venv
INSTALLED := $(VENV)/.installed
# DVC runs the stages' `python -m pipelines.<stage>` with the environment's python.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: repro test

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

repro: $(INSTALLED)
	$(IN_VENV) python -m pipelines.preflight
	$(IN_VENV) dvc repro

test: $(INSTALLED)
	$(IN_VENV) python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$status
