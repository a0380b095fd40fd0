# The two commands of the README. Each creates (or updates, when pyproject.toml changed) the
# virtual environment .venv on first use, so a fresh clone needs nothing else.
#   make repro   the main job: `dvc repro` of every stage on params.yaml (smoke profile, offline),
#                after a preflight of everything the profile needs (python -m pipelines.preflight)
#   make test    the tests, exactly as CI (.ci/run) runs them; installs Debian's chromium (the
#                browser check of the MLflow UI) and the SWORD Bible modules sword-text-web and
#                sword-text-sparv (the real-corpus reader) where missing and apt-get can (as root)
#   make ui      the MLflow UI on the project's store, opened on the runs table
# The venv's Python: 3.11 as CI runs it; 3.12 and 3.13 are supported too (make PYTHON=python3.13).
PYTHON ?= python3.11
VENV := .venv
INSTALLED := $(VENV)/.installed
# DVC runs the stages' `python -m pipelines.<stage>` with the environment's python.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: repro test ui debian

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

repro: $(INSTALLED)
	$(IN_VENV) python -m pipelines.preflight
	$(IN_VENV) dvc repro

# Debian packages some tests use where present: chromium (the browser check of the MLflow UI)
# and the SWORD Bible modules (the real-corpus reader checked on the real texts).
SWORD_PACKAGES := sword-text-web sword-text-sparv
APT_INSTALL = apt-get install -y -q $$missing >/dev/null 2>&1

debian:
	@missing=""; command -v chromium >/dev/null || missing=chromium; \
	for package in $(SWORD_PACKAGES); do \
		dpkg -s $$package >/dev/null 2>&1 || missing="$$missing $$package"; done; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { $(APT_INSTALL) || { apt-get update -q >/dev/null 2>&1 && $(APT_INSTALL); }; }; } \
		|| echo "could not install $$missing: the tests that need them are skipped (and named)" >&2

ui: $(INSTALLED)
	$(IN_VENV) python -m pipelines.ui

test: $(INSTALLED) debian
	$(IN_VENV) python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$status
