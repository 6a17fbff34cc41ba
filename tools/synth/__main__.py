"""`python -m tools.synth ...`: tools/synth/cli.py's command."""
from tools.synth.cli import app

app(prog_name="python -m tools.synth")
