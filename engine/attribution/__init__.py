"""Two-length decode attribution: where a decode step's time goes, per part (`engine attribute`)."""
