"""The caches: a pair's metrics and its judged results, so a re-run reads rather than recomputes."""
