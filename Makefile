# The two commands of the README. Each creates (or, when the lock changed, recreates) the virtual
# environment .venv from the lock on first use, so a fresh clone needs nothing else.
#   make repro   the main job: `dvc repro` of every stage on params.yaml (smoke profile, offline;
#                portable CPU kernels, or make repro KERNELS=native),
#                after a preflight of everything the profile needs (pipelines.commands.preflight);
#                then the README's claims matrix from the new verdicts (pipelines.verdicts.matrix)
#                and how far the outputs are from the committed ones (...commands.compare_outputs)
#   make test    the tests, exactly as CI (.ci/run) runs them; installs Debian's chromium (the
#                browser check of the MLflow UI) and the SWORD Bible modules sword-text-web and
#                sword-text-sparv (the real-corpus reader) where missing and apt-get can (as root)
#   make ui      the MLflow UI on the project's store, opened on the runs table
#   make lock    re-resolves the locks (requirements/*.txt) from pyproject.toml on PyPI, with uv
#   make mutation  mutation testing of the claims' checks (tools/mutation.py, mutmut in its
#                own environment .mutmut, outside the lock): reports/measurements/claims_mutation
#   make chaos   a sweep on a two-node Ray cluster on this machine, its worker node killed whole,
#                then its trial workers one by one (tools/chaos.py): reports/measurements/chaos
# The venv's Python: 3.11 as CI runs it; 3.12 and 3.13 are supported too (make PYTHON=python3.13).
PYTHON ?= python3.11
VENV := .venv
# torch's build: cuda (PyPI's torch, with NVIDIA's libraries) where an NVIDIA GPU is seen — listed
# by `nvidia-smi -L`, or by the driver under /proc when nvidia-smi is missing —, else cpu (the
# same release's CPU build, from PyTorch's CPU index); `make TORCH=cpu ...` or TORCH=cuda chooses.
GPU_SEEN := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo nvidia-smi; \
	ls /proc/driver/nvidia/gpus 2>/dev/null | grep -q . && echo driver)
TORCH ?= $(if $(GPU_SEEN),cuda,cpu)
ifeq ($(filter $(TORCH),cpu cuda),)
$(error TORCH must be cpu or cuda, got "$(TORCH)": make TORCH=cpu installs torch's CPU build, TORCH=cuda PyPI's CUDA build)
endif
WHY_TORCH := $(if $(filter command line environment,$(origin TORCH)),TORCH=$(TORCH) given,$(if \
	$(GPU_SEEN),an NVIDIA GPU is seen ($(strip $(GPU_SEEN))),no NVIDIA GPU is seen)); make TORCH=cpu|cuda chooses
TORCH_CPU_PIN := $(shell sed -n 's/^\(torch==[^ ]*\).*/\1/p' requirements/torch-cpu.txt)
NO_CPU_INDEX := could not install $(TORCH_CPU_PIN) from PyTorch's CPU index \
	(https://download.pytorch.org/whl/cpu). Where only PyPI is reachable, run instead: \
	make $(or $(MAKECMDGOALS),repro) TORCH=cuda   (PyPI's build of the same torch, ~3 GB with NVIDIA's \
	libraries; it runs on a CPU too)
LOCK := requirements/$(TORCH).txt
INSTALLED := $(VENV)/.installed-$(TORCH)
PIP := $(VENV)/bin/pip --quiet --disable-pip-version-check
# DVC runs the stages' `python -m pipelines.<stage>` with the environment's python.
IN_VENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH"
STALE_LOCK := echo "$(LOCK) does not hold what pyproject.toml requires: run make lock" >&2

.PHONY: repro test ui debian lock mutation chaos gpu-rehearsal

# The environment is the lock's: every distribution at its version and hash (no resolution, no
# unpinned download), made anew when the lock changes. Then the project itself, editable, built
# without build isolation (its build requirements are locked too), again when pyproject.toml
# changes; `pip check` holds the lock to what pyproject.toml requires.
LOCKED := $(VENV)/.locked-$(TORCH)

# torch first: where PyTorch's CPU index cannot be reached the step fails in seconds (one retry),
# before the other downloads, and says the one command that works instead.
$(LOCKED): $(LOCK) requirements/torch-cpu.txt
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null \
		|| { echo "make: $(PYTHON) is missing or not Python 3.11-3.13: install Python 3.11 (as CI)" \
		"or name another, e.g. make $(or $(MAKECMDGOALS),repro) PYTHON=python3.13" >&2; exit 1; }
	@echo "make: .venv with Python $$($(PYTHON) -c 'import platform; print(platform.python_version())')" \
		"($(PYTHON)) and torch's $(TORCH) build: $(WHY_TORCH)"
	$(PYTHON) -m venv --clear $(VENV)
	$(if $(filter cpu,$(TORCH)),$(PIP) install --require-hashes --no-deps --retries 1 --timeout 30 \
		-r requirements/torch-cpu.txt || { echo "make: $(NO_CPU_INDEX)" >&2; exit 1; })
	$(PIP) install --require-hashes --no-deps -r $(LOCK)
	touch $@

$(INSTALLED): $(LOCKED) pyproject.toml
	$(PIP) install --no-deps --no-build-isolation -e .
	$(VENV)/bin/pip check || { $(STALE_LOCK); exit 1; }
	touch $@

# The CPU kernels of make repro: portable (the default: torch's, MKL's and oneDNN's kernels
# pinned — oneDNN capped at SSE4.1, which every x86-64 machine of the last 15 years has, for
# the GELU of APE's BERT — the fused normalizers compiled for the x86-64 baseline: the same
# bytes on other x86 machines, the committed outputs' among them, docs/pipeline.md)
# or native (this CPU's own: faster, numbers off in the last digits).
KERNELS ?= portable
ifeq ($(filter $(KERNELS),portable native),)
$(error KERNELS must be portable or native, got "$(KERNELS)")
endif
PORTABLE_KERNELS := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
KERNEL_ENV := $(if $(filter portable,$(KERNELS)),$(PORTABLE_KERNELS))

repro: $(INSTALLED)
	$(KERNEL_ENV) $(IN_VENV) python -m pipelines.commands.preflight
	$(KERNEL_ENV) $(IN_VENV) dvc repro
	$(IN_VENV) python -m pipelines.verdicts.matrix
	$(IN_VENV) python -m pipelines.commands.compare_outputs

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
	$(IN_VENV) python -m pipelines.commands.ui

test: $(INSTALLED) debian
	$(IN_VENV) python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi; exit $$status

# mutmut (pyproject.toml's [tool.mutmut]: what decides a verdict, and its tests) on 1 worker,
# from scratch: about an hour on 2 cores (34 min with tools/mutation.py --workers 2). Its counts
# go to reports/measurements/claims_mutation.
mutation: $(INSTALLED)
	$(IN_VENV) python tools/mutation.py

# Three sweeps of 24 trials on a head and a worker node started here (loopback, token auth, a
# loopback MLflow server): no fault, the worker node SIGKILLed mid-sweep and restarted, running
# trial workers SIGKILLed at random every 15 s; 27-36 min alone on 2 cores against the
# authenticated server (three runs, 2026-11-29; its checks read every metric history back through
# basic auth; a run that fails takes longer: tools/chaos.py --timeout).
# Counts: reports/measurements/chaos.
chaos: $(INSTALLED)
	$(IN_VENV) python tools/chaos.py --kill-every 15

# The AST device call (docs/gpu-records.md) rehearsed on the CPU in the GPU machine's versions:
# .venv-device (Python 3.12, torch 2.11, Triton 3.6, transformers 5.17, sentencepiece 0.2.2, from
# PyPI, ~3.6 GB: PyPI's torch is the CUDA build, which runs on the CPU too), then the call's
# command with --device cpu on the tiny profile benchmarks/gpu/rehearsal.yaml, a 240 s limit.
# Output: .ast-grid-rehearsal/out (grid.json, grid.tar.gz, log.txt, preflight.xml). The call took
# 91 s on 2 shared cores (2026-11-28); the first download of the venv some minutes more.
DEVICE_PYTHON ?= python3.12
DEVICE_VENV := .venv-device
DEVICE_VERSIONS := torch==2.11.0 triton==3.6.0 "transformers>=5.17,<5.18" sentencepiece==0.2.2 \
	"sacrebleu>=2.6,<2.7" scikit-learn matplotlib pyyaml numpy scipy pytest diptest==0.12.0
REHEARSAL := .ast-grid-rehearsal
REHEARSE := $(DEVICE_VENV)/bin/python -m pipelines.commands.ast_grid --profiles benchmarks/gpu \
	--profile rehearsal --data $(REHEARSAL)/data

$(DEVICE_VENV)/.installed:
	@command -v $(DEVICE_PYTHON) >/dev/null 2>&1 || { echo "no $(DEVICE_PYTHON) on PATH:" \
		"install Python 3.12, or name one with make gpu-rehearsal DEVICE_PYTHON=/path/python3.12" >&2; exit 1; }
	$(DEVICE_PYTHON) -m venv --clear $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/pip install --quiet --disable-pip-version-check $(DEVICE_VERSIONS)
	touch $@

gpu-rehearsal: $(DEVICE_VENV)/.installed
	rm -rf $(REHEARSAL) && $(REHEARSE) --prepare
	export CALL_START=$$(date +%s) PYTHONUNBUFFERED=1 && $(REHEARSE) --out $(REHEARSAL)/out \
		--work $(REHEARSAL)/work --device cpu --limit-s 240
	@echo "the rehearsal's output: $(REHEARSAL)/out"

# The locks: one universal resolution (Linux, Python 3.11-3.13) of the dev extra on PyPI, with every
# wheel's hash; the CPU lock the same, at the same torch release, without torch and what only its
# CUDA build requires. uv keeps the versions already locked unless pyproject.toml needs others
# (UPGRADE=1 takes the newest allowed). uv runs from its own environment, so that a lock that no
# longer installs can still be refreshed.
UV_VERSION := 0.13.9
UV := .uv/bin/uv
UV_COMPILE = $(UV) pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
	--generate-hashes --quiet --custom-compile-command "make lock" $(if $(UPGRADE),--upgrade)
TORCH_RELEASE := .uv/torch-release.txt

$(UV):
	$(PYTHON) -m venv --clear .uv
	.uv/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

lock: $(UV)
	$(UV_COMPILE) -o requirements/cuda.txt
	sed -n 's/^\(torch==[^ ;]*\).*/\1/p' requirements/cuda.txt > $(TORCH_RELEASE)
	$(UV_COMPILE) --override requirements/cpu-overrides.txt --constraint $(TORCH_RELEASE) \
		--no-emit-package torch -o requirements/cpu.txt
	@grep -q "^$$(cat $(TORCH_RELEASE))+cpu " requirements/torch-cpu.txt || { echo "make lock:" \
		"torch is now $$(cat $(TORCH_RELEASE)): pin its +cpu build with the CPU wheels' hashes in" \
		"requirements/torch-cpu.txt (its header says how)" >&2; exit 1; }
