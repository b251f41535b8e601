"""`python -m engine` runs bmoe-py."""

from engine.cli import main

main()
