"""The ``--help`` of every command: options with their defaults.

Every argument parser of the package uses :class:`HelpFormatter`, so that ``--help``
shows what an option does when it is not given without each help text repeating it.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` states ``action``'s default: an option whose default is a value
    (not ``None``, not a flag's ``False``, not suppressed)."""
    if not action.option_strings or isinstance(action, (argparse._HelpAction,
                                                       argparse._VersionAction)):
        return False
    default = action.default
    if default is None or default is argparse.SUPPRESS or default == []:
        return False
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return False  # the flag's name says it: given or not
    return not (isinstance(action, argparse.BooleanOptionalAction) and default is None)


def format_default(value: Any) -> str:
    """A default as a user would type it: a list as its items (``nargs``), a tuple as an
    image size ``HxW`` (the only tuples the commands take)."""
    if isinstance(value, tuple):
        return 'x'.join(str(v) for v in value)
    if isinstance(value, list):
        return ' '.join(str(v) for v in value)
    if isinstance(value, str) and not value:
        return "''"
    return str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and ends every option's help with its default
    (``default: X``), unless the help already speaks of it."""

    def _format_action(self, action: argparse.Action) -> str:
        if not (action.help or '').strip() and shows_default(action):
            action = copy.copy(action)
            action.help = 'default: ' + format_default(action.default).replace('%', '%%')
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or '').strip()
        if not shows_default(action) or '%(default)' in text:
            return text
        if 'default' in text.lower():
            return text  # the help says it in its own words
        shown = format_default(action.default).replace('%', '%%')
        return f'{text} (default: {shown})' if text else f'default: {shown}'
