"""What a bench folder holds and what is made of it: the records, the per-configuration summary,
``report.md``, the figures and the exports (sub-folder rules: README.md)."""
