# The two commands of the README. Each sets up .venv on first use.
.PHONY: demo test setup bench

setup:
	@scripts/setup

# The attention-fault run is meant to alert: its gate exit code 1 is the
# expected outcome here, so only 0/1 count as success (2 = input error).
demo: setup
	.venv/bin/ckptscan trend sample_checkpoints/attention_fault --html ckptscan-demo.html || [ $$? -eq 1 ]

test: setup
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python bench/attention_layer.py
