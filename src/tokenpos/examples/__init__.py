"""Runnable examples: ``python -m tokenpos.examples.<name> --help``."""
