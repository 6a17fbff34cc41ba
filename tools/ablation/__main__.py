"""`python -m tools.ablation ...`: tools/ablation/cli.py's command."""
from tools.ablation.cli import app

app(prog_name="python -m tools.ablation")
