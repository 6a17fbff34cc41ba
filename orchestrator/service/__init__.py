"""The service (`orchestrator serve`): scheduled grids (`schedule`), a job queue over SQLite (`queue`),
queued gates run on Ray exactly as the CLI runs them (`run`), threads and signals (`daemon`), and the
HTTP front (`http_api`)."""
