"""The pipeline: resolve what to scan, compute its metrics, judge them; scan_pair, scan_run, watch_run."""
