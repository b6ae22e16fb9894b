"""``specdec tune``: the certified search for each policy's parameters and K (sub-folder rules:
README.md)."""
