"""Sub-commands (filled in by the owning work stream)."""


def register(sub) -> None:
    """Add this module's sub-commands to ``sub`` (argparse subparsers)."""
