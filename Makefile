# kvtier: the two set-up commands are `make demo` and `make test`; both install
# what they need (scripts/setup.sh) on a fresh machine.
.PHONY: demo test install setup setup-test setup-vllm setup-integrations build release native fmt clippy arch lint-py py-stubs rust-test py-test vllm-test integrations-test bench clean

CARGO ?= cargo

# CI builds once from a clean clone: incremental state would only take disk
# (about 2 GB of target/debug/incremental) that the vLLM install needs later.
ifdef CI
export CARGO_INCREMENTAL := 0
endif

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

release: setup
	$(CARGO) build --release -p kvtier

demo: release native
	scripts/demo.sh

# Puts `kvtier` on PATH (~/.cargo/bin); the Python SDK: pip install -e python
# Only what `cargo install` needs (Rust >= 1.89 and a C compiler), not
# `setup`'s apt packages and Python venv.
install:
	$(CARGO) install --locked --path crates/kvtier

# kvtier._native, the Rust client core as a Python extension (crates/kvtier-py),
# into python/kvtier/ where every venv's editable install and PYTHONPATH=python find it.
native: setup
	PYTHON=.venv/bin/python scripts/build-native.sh

fmt:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The example README.md runs (python/tests/test_readme.py) is built here with
# the README's own command, so that test times the run, not a compile (a
# package-only build unifies features differently and rebuilds dependencies).
# Under CI the test executables are deleted once they passed (about 2.9 GB of
# target/debug/deps, one ~60 MB binary per tests/*.rs; the vLLM install needs
# the disk). Only unlinked, extension-less executables go: binaries that
# target/debug/ hard-links (kvtier, used by the Python suites), libraries and
# proc-macros stay, so nothing is rebuilt.
rust-test:
	$(CARGO) test --workspace
	$(CARGO) build -q -p kvtier-client --example quickstart
ifdef CI
	find target/debug/deps -maxdepth 1 -type f -perm -u+x -links 1 ! -name '*.*' -delete
endif

# No module circles (crates, python/kvtier), no source file over 600 lines,
# every file says why it exists, every path the docs name exists
# (docs/architecture.md, "Checked shape"); the self-test first proves each rule
# can fail.
arch:
	python3 scripts/check-architecture.py --self-test
	python3 scripts/check-architecture.py

# The Python SDK's lint and type check (config: python/pyproject.toml), and the
# measurement library's and scripts' (perf/, scripts/: ruff.toml, mypy.ini).
lint-py: setup-test native
	.venv/bin/ruff check python perf scripts
	cd python && ../.venv/bin/mypy
	.venv/bin/mypy

# Generates the SDK's gRPC stubs in this checkout (python/kvtier/_gen); they are
# also regenerated on import when the protos change, and built into a wheel.
py-stubs: setup
	PYTHONPATH=python .venv/bin/python -m kvtier._proto

py-test: native
	.venv/bin/python -m pytest -q python/tests --ignore=python/tests/vllm --ignore=python/tests/integrations

# vLLM's CPU build lives in its own venv (.tools/vllm, ~6.5 GB, kept between runs).
setup-vllm:
	@scripts/setup-vllm.sh

# The Python suites use target/debug/kvtier as `cargo test` left it (their
# conftest builds it when missing); a separate `cargo build -p kvtier` would
# compile the workspace again with other features.
# The serving benchmark's peers (python/tests/vllm/test_peers.py) include
# LMCache's server, from setup-integrations' venv.
vllm-test: setup-vllm setup-integrations native
	.tools/vllm/bin/python -m pytest -q python/tests/vllm

# LMCache and SGLang's storage interface in their own venv (.tools/lmcache, ~1.5 GB; torch shared with .tools/vllm).
setup-integrations:
	@scripts/setup-lmcache.sh

integrations-test: setup-integrations native
	.tools/lmcache/bin/python -m pytest -q python/tests/integrations

test: setup-test fmt clippy arch native lint-py rust-test py-test vllm-test integrations-test

bench:
	scripts/bench-engine.sh

clean:
	$(CARGO) clean
	rm -rf out .venv
