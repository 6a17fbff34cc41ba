"""Two-length decode attribution: where a decode step's time goes, per part (`python -m tools.attribution`).
A tool beside the engine core (issue 51): the engine marks its parts (engine/scopes.py) and measures
its own floor (engine/floor.py); this reads them."""
