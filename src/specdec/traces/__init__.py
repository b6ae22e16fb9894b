"""Traces and replay: greedy traces of a target and its drafts, and their replay on any
machine's cost tables (folder rules: README.md)."""
