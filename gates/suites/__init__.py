"""The gate suites (run by the orchestrator with `pytest -p gates.census`)."""
