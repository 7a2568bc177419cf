"""The application layer: the ``labeldp`` command, the demo and the benchmarks. It drives both parties, so it is
the one package allowed to import both (see the import-linter contracts in pyproject.toml)."""
