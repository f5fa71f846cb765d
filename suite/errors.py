"""Errors that carry one readable line for the user."""


class ConfigError(ValueError):
    """A point that cannot run as configured. Raised before launch; the message is one line."""
