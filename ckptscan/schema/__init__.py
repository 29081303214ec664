"""The result types of a scan and reading their JSON back."""
