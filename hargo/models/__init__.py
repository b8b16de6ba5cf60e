"""Model sources: the embedded SmolLM2 wheel, a hub id or a local folder."""
