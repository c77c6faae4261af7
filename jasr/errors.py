"""Errors that name a user's mistake (shared by the config, the model families and the command line)."""


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it."""
