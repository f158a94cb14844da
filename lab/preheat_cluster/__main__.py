"""`python -m preheat_cluster up|down|status|logs`."""

from .cli import main

main()
