"""Models and backends: the backend contract and its implementations, the cost model, model
sources and the cache on disk (folder rules: README.md)."""
