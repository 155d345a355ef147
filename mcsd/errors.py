"""Errors that mean the user asked for something that cannot work.

The command-line apps print their message as one line and exit with status 2; the
message names the setting at fault and the fix.
"""


class MCSDError(ValueError):
    """A bad configuration or input, reported to the user as one line."""
