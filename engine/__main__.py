"""`python -m engine` runs bmoe-py."""

from engine.app.cli import main

main()
