# The two commands: `make demo` (the main job) and `make test`.
# Each sets up .venv first if needed (scripts/setup_env.sh is idempotent).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test lint

setup:
	@bash scripts/setup_env.sh

demo: setup
	$(PY) demo/demo.py

test: setup
	$(PY) -m pytest -q -n 3 --dist loadgroup --no-loadscope-reorder

# SGLang's black / isort / ruff on this repository's own Python (the tools, tests, demo).
lint: setup
	$(PY) scripts/lint_series.py --repo
