# kvpage — two commands on a fresh Debian machine:
#   make run    install missing packages, build the CLI only, print the capacity comparison and
#               draw the plot, answer the fleet question (the fewest H100s, with which router
#               and tp, that serve the first RUN_SLO_REQUESTS Mooncake requests within RUN_SLO),
#               then replay the first 2,000 Mooncake requests through the simulator
#   make test   install missing packages, build everything, run every test with ctest
#   make install PREFIX=/opt/kvpage   headers, libraries, CMake package, kvpage.pc, CLI and its data
BUILD_DIR ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
RUN_MODELS ?= qwen3-8b,mistral-7b-v0.3,llama-3.1-8b,gemma-3-4b-it,gpt-oss-20b,deepseek-v2-lite,qwen3.5-9b,qwen3.5-0.8b,nemotron-3-nano-30b-a3b,llama-4-scout-17b-16e-instruct,deepseek-v3.2
RUN_CONTEXTS ?= 4K,32K,128K
# The short simulation `make run` does after the planner table (a few seconds).
RUN_SIM_MODEL ?= qwen3-8b
RUN_SIM_GPU ?= h100
RUN_SIM_TRACE ?= sim/data/traces/mooncake_conversation_trace.jsonl
RUN_SIM_REQUESTS ?= 2000
# The fleet question `make run` answers (kvpage plan --slo): the fewest GPUs running
# $(RUN_SIM_MODEL) that serve the first RUN_SLO_REQUESTS requests of $(RUN_SIM_TRACE) within
# RUN_SLO, for each router and tensor-parallel degree (docs/capacity_planning.md §8).
RUN_SLO ?= ttft-p99=3s,tpot-p99=100ms
RUN_SLO_REQUESTS ?= 1000
RUN_SLO_ROUTERS ?= round-robin,least-loaded,prefix-aware,kv-events
RUN_SLO_TP ?= 1,2

ASAN_BUILD_DIR ?= build-asan
PREFIX ?= /usr/local

.PHONY: all bootstrap configure build build-cli run test test-sanitize fuzz bench install clean

all: build

bootstrap:
	@bash scripts/bootstrap.sh
	@bash scripts/python_env.sh $(BUILD_DIR)/venv

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

configure: bootstrap $(BUILD_DIR)/CMakeCache.txt

# Everything: library, CLI, tests, benchmarks, fuzz replays and (with nvcc) CUDA kernels.
build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Only what `make run` runs: the kvpage CLI and the libraries under it.
build-cli: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target kvpage_cli

# The main job on bundled defaults: all three policies for the bundled models at 4K/32K/128K,
# with the concurrency each allows on one H100 (90% of memory, minus weights), and the plot;
# then the fleet question: the SLO search over routers and tp (table, and slo.png); then a
# short single-replica simulation (JSON, CSVs and sim.png in $(BUILD_DIR)/sim).
run: build-cli
	$(BUILD_DIR)/bin/kvpage plan --compare --model $(RUN_MODELS) --context $(RUN_CONTEXTS) \
	  --gpu h100 --plot $(BUILD_DIR)/plan.png
	$(BUILD_DIR)/bin/kvpage plan --trace $(RUN_SIM_TRACE) --slo $(RUN_SLO) \
	  --model $(RUN_SIM_MODEL) --gpu $(RUN_SIM_GPU) --max-requests $(RUN_SLO_REQUESTS) \
	  --routers $(RUN_SLO_ROUTERS) --tp $(RUN_SLO_TP) --plot $(BUILD_DIR)/slo.png
	$(BUILD_DIR)/bin/kvpage sim --model $(RUN_SIM_MODEL) --gpu $(RUN_SIM_GPU) \
	  --trace $(RUN_SIM_TRACE) --max-requests $(RUN_SIM_REQUESTS) \
	  --output-json $(BUILD_DIR)/sim/sim.json --output-dir $(BUILD_DIR)/sim

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer (CI runs both).
test-sanitize: bootstrap
	cmake -S . -B $(ASAN_BUILD_DIR) -DCMAKE_BUILD_TYPE=Debug -DKVPAGE_SANITIZE=ON \
	  -DKVPAGE_BUILD_CUDA=OFF -DKVPAGE_BUILD_BENCHMARKS=OFF $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	cd $(ASAN_BUILD_DIR) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# libFuzzer harnesses (fuzz/) built with clang 16 and run FUZZ_SECONDS each (default 60);
# installs clang-16 if it is missing. Fails on any finding. make test replays their corpora.
fuzz:
	@KVPAGE_FUZZ_DEPS=1 bash scripts/bootstrap.sh
	bash scripts/fuzz.sh

bench: build
	$(BUILD_DIR)/bin/kvpage_benchmarks

# docs/install.md: what lands under $(PREFIX) and how another project finds it.
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR)
