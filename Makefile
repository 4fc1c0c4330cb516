# gemforge: `make demo` and `make test` each work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp records that the venv holds the current pyproject's dependencies;
# editing pyproject.toml re-runs the install, an unchanged one is reused.
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: install install-icarus demo test test-slow bench bench-synth bench-sweep bench-tuning tuning-defaults clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/gemforge demo

test: install
	$(BIN)/python -m pytest -q -n $(JOBS) -m "not slow"

install-icarus:
	command -v iverilog >/dev/null || (apt-get update -qq && apt-get install -y -qq iverilog)

test-slow: install
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow

# The GPU figures come from BENCHMARKS.gpu.json, measured on a machine with a GPU by
# `gemforge bench --sections gpu -o BENCHMARKS.gpu.json`; this machine needs none. The
# synthesis figures come from BENCHMARKS.synth.json (`make bench-synth`, about an hour), the
# design sweep's from BENCHMARKS.sweep.json (`make bench-sweep`, under an hour), the schedule
# search's from BENCHMARKS.tuning.json (`make bench-tuning`, about a quarter of an hour).
bench: install
	$(BIN)/gemforge bench --config default --device verilator --core-configs tiny,large \
		--merge BENCHMARKS.gpu.json --merge BENCHMARKS.synth.json --merge BENCHMARKS.sweep.json \
		--merge BENCHMARKS.tuning.json \
		--markdown BENCHMARKS.md

bench-synth: install
	$(BIN)/gemforge bench --sections synth -o BENCHMARKS.synth.json

bench-sweep: install
	$(BIN)/gemforge bench --sections sweep -o BENCHMARKS.sweep.json

# The tuning logs shipped for the presets (compiler/tuning/defaults/): ResNet-18's and MobileNetV2's
# accelerator layers tuned on the cycle model (deterministic; a quarter of an hour per preset).
tuning-defaults: install
	$(BIN)/python -m gemforge.driver.tools.tune default

bench-tuning: install
	$(BIN)/gemforge bench --sections tuning -o BENCHMARKS.tuning.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
