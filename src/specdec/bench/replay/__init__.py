"""``specdec trace`` and ``specdec replay`` over a bench folder (sub-folder rules: README.md)."""
