"""`python -m collectives.explain ...`: see cli.py."""

from .cli import main

main()
