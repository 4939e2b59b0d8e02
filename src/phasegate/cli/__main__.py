"""``python -m phasegate.cli``."""

from phasegate.cli import main

main()
