"""Front ends other than the command line: the Python API, the flags the commands share, the
HTTP server and vLLM's plugin (folder rules: README.md)."""
