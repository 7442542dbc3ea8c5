# Thin wrappers around scripts/ (the scripts are the interface; README "Safety
# evidence" says what each does). Heavy targets run one at a time: don't use make -j.
BUILD ?= build
LIB ?= $(BUILD)/libkeel.so
FUZZ_SECONDS ?= 1200
SOAK_SECONDS ?= 300

.NOTPARALLEL:
.PHONY: build test sanitize fuzz fuzz-quick faults suites suites-quick soak soak-quick safety

build:
	bash scripts/build.sh

test:
	bash scripts/test.sh

# UBSan (api, unit, stress, misuse, faults), TSan (tests/sanitize), KEEL_DEBUG=2: ~5 min
sanitize:
	bash scripts/sanitize.sh

# libFuzzer, 20 minutes (FUZZ_SECONDS); crashes land in tests/fuzz/regressions/
fuzz:
	bash scripts/fuzz.sh --time $(FUZZ_SECONDS)

fuzz-quick:
	bash scripts/fuzz.sh --quick

faults: build
	ctest --test-dir $(BUILD) -L faults --output-on-failure

# CPython regrtest + MariaDB mtr, under glibc then Keel; results/suites/full-summary.md
suites: build
	bash scripts/suites.sh --full --alloc both --lib $(LIB)

suites-quick: build
	bash scripts/suites.sh --quick --alloc both --lib $(LIB)

# Redis and MariaDB, 5 minutes each under continuous load (10 minutes); results/soak/
soak: build
	bash scripts/soak.sh --seconds $(SOAK_SECONDS) --lib $(LIB)

soak-quick: build
	bash scripts/soak.sh --seconds 60 --lib $(LIB)

# Everything above in its CI-sized form.
safety: sanitize fuzz-quick faults suites-quick soak-quick
