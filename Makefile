# The two commands of the README. Each sets up .venv on first use: `demo` with
# the core and matplotlib (for --html), `test` with everything the suite needs.
.PHONY: demo test test-start setup setup-demo setup-docs docs bench bench-scale bench-trend bench-diff bench-watch bench-remote bench-ray bench-long

setup:
	@scripts/setup test

setup-demo:
	@scripts/setup demo

setup-docs:
	@scripts/setup docs

# The attention-fault run is meant to alert: its gate exit code 1 is the
# expected outcome here, so only 0/1 count as success (2 = input error).
demo: setup-demo
	@echo "demo: ckptscan trend on sample_checkpoints/attention_fault, a run with an injected attention fault."
	@echo "demo: the expected verdict is ALERT, and the gate's exit code 1 (make demo still succeeds)."
	.venv/bin/ckptscan trend sample_checkpoints/attention_fault --html ckptscan-demo.html || [ $$? -eq 1 ]
	@echo "demo: ALERT is the expected verdict on this faulty run; the report is in ckptscan-demo.html"

# Lint first (ruff and mypy, configured in pyproject.toml), then the tests on
# two workers (pytest-xdist); tests/conftest.py keeps each module, and the
# tests sharing a server or cluster, on one worker.
test: test-start setup
	@echo "test: ruff and mypy on the package, then the suite on 2 workers (pytest -n 2)"
	.venv/bin/python -m ruff check
	.venv/bin/python -m mypy
	.venv/bin/python -m pytest -n 2 --dist loadgroup

# Said before setup, whose first run installs for about two minutes without a word of its own.
test-start:
	@echo "test: about 7.5 minutes end to end on 2 cores from a fresh clone (7 min 24 s measured for issue 52), of which"
	@echo "test: about 2 minutes the first setup of .venv and .ci/node (about 2.7 GB on disk: du -sc .venv .ci)"

# The documentation site (MkDocs Material, the `docs` extra) into site/: nor the test extra nor Azurite.
docs: setup-docs
	.venv/bin/mkdocs build --strict

# Benchmarks print ratios measured side by side in one run (docs/performance.md).
bench: setup
	.venv/bin/python bench/attention_layer.py

bench-scale: setup   # ~27 GB of generated checkpoints under /tmp/ckptscan-bench
	.venv/bin/python bench/scale.py

bench-trend: setup   # 20 checkpoints of a 1.1B-shaped model
	.venv/bin/python bench/trend_run.py

bench-diff: setup    # 1B-shaped pair: diff vs a hand-written floor (head included), peak RSS, start-up, worker overlap; before = the regressed 2d305f8 (#50)
	.venv/bin/python bench/diff_overhead.py --before 2d305f8

bench-watch: setup   # ~1.3 GB of generated checkpoints under /tmp/ckptscan-bench
	.venv/bin/python bench/watch_latency.py

bench-remote: setup   # a 1B-shaped pair (~6 GB under /tmp) served over S3 from loopback
	.venv/bin/python bench/remote.py

bench-ray: setup   # --executor ray vs local on 20 checkpoints (14 GB under /tmp/ckptscan-bench-ray); projection
	.venv/bin/python bench/ray_overhead.py

bench-long: setup   # judge per new pair to 10,000 pairs, report size, 2,003 tiny checkpoints under /tmp/ckptscan-bench-long
	.venv/bin/python bench/long_run.py
