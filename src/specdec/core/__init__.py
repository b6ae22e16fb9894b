"""The decoding core: the engine loop, requests and their settings, K policies, drafters and
verification rules (folder rules: README.md)."""
