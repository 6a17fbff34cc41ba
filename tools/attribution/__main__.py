"""`python -m tools.attribution ...`: tools/attribution/cli.py's command."""
from tools.attribution.cli import app

app(prog_name="python -m tools.attribution")
