"""Errors that end a command with a message for the user, not a traceback."""


class UserError(Exception):
    """Bad configuration, arguments or files: the message says what and how to fix it."""


class ConfigError(UserError):
    """A config file is invalid. ``field`` names the offending key (dotted, e.g. ``loop.rate_hz``)."""

    def __init__(self, path, field, problem, fix):
        self.path, self.field = str(path), field
        super().__init__(f"config {path}: field '{field}': {problem}. Fix: {fix}")
