"""Data stages: ``prepare`` (raw HPC-GPT files -> prepared splits) and ``validate`` (Great
Expectations contracts over raw and prepared data)."""
