"""The benchmarks a bench run asks: their samples, the data they ship, the one prompt format (sub-folder
rules: README.md)."""
