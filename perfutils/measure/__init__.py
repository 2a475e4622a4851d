"""Everything that runs on a GPU and records what it measured (data/<gpu-slug>/<study>.csv + .json)."""
