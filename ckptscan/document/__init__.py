"""The JSON report's format: a report as plain values, written (schema 1, or 2 with its parts) and read back."""
