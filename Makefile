# The two commands of the README. Each sets up .venv on first use.
.PHONY: demo test setup bench

setup:
	@scripts/setup

demo: setup
	.venv/bin/ckptscan trend sample_checkpoints/attention_fault

test: setup
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python bench/attention_layer.py
