"""How an answer is scored: pass@1 (model-written code run in a sandbox), math accuracy, JSON
validity, agreement with ``ar`` (sub-folder rules: README.md)."""
