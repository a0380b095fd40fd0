# The two commands of the README. Each creates (or updates, when pyproject.toml changed) the
# virtual environment .venv on first use, so a fresh clone needs nothing else.
#   make repro   the main job: `dvc repro` of every stage on params.yaml (smoke profile, offline),
#                after a preflight of everything the profile needs (python -m pipelines.preflight)
#   make test    the tests, exactly as CI (.ci/run) runs them; installs Debian's chromium for the
#                browser check of the MLflow UI where it is missing and apt-get can (as root)
#   make ui      the MLflow UI on the project's store, opened on the runs table
PYTHON ?= python3.11
VENV := .venv
INSTALLED := $(VENV)/.installed
# DVC runs the stages' `python -m pipelines.<stage>` with the environment's python.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: repro test ui browser

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

repro: $(INSTALLED)
	$(IN_VENV) python -m pipelines.preflight
	$(IN_VENV) dvc repro

APT_CHROMIUM := apt-get install -y -q chromium >/dev/null 2>&1

browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { $(APT_CHROMIUM) || { apt-get update -q >/dev/null 2>&1 && $(APT_CHROMIUM); }; }; } \
		|| echo "no chromium: the browser check of the MLflow UI will be skipped" >&2

ui: $(INSTALLED)
	$(IN_VENV) python -m pipelines.ui

test: $(INSTALLED) browser
	$(IN_VENV) python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$status
