# kvtier: the two set-up commands are `make demo` and `make test`; both install
# what they need (scripts/setup.sh) on a fresh machine.
.PHONY: demo test setup setup-test build release fmt clippy rust-test py-test bench clean

CARGO ?= cargo

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

release: setup
	$(CARGO) build --release -p kvtier

demo: release
	scripts/demo.sh

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

rust-test:
	$(CARGO) test --workspace

py-test:
	.venv/bin/python -m pytest -q python/tests

test: setup-test fmt clippy rust-test py-test

bench:
	scripts/bench-engine.sh

clean:
	$(CARGO) clean
	rm -rf out .venv
