"""``specdec bench``: its command and the interleaved, resumable loop with what it runs (our
configurations and the peers; sub-folder rules: README.md)."""
