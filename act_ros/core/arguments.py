"""The ``--help`` of every command: options with their defaults.

Every argument parser of the package uses :class:`HelpFormatter`, so that ``--help``
shows what an option does when it is not given without each help text repeating it.

A settings dataclass declares each option once, as a field made by :func:`option` (its
help, choices, bounds); :func:`add_options` makes the command line from the fields and
:func:`check_options` checks a value against the same declaration. (Not draccus: its
``--field_name`` options, ``--config_path`` files and flags would change every command
line the docs quote; these three functions keep them and are shorter.)
"""

from __future__ import annotations

import argparse
import copy
import math
import types
import typing
from dataclasses import MISSING, field, fields
from pathlib import Path
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


def option(default: Any = MISSING, help: str = '', *, factory: Any = MISSING,
           **meta: Any) -> Any:
    """A dataclass field that is a command-line option too. ``meta``: ``flag`` (the option
    string; default ``--field-name``, ``--no-field-name`` for a flag on by default),
    ``choices``, ``bounds`` (``'>= 1'``, ``'> 0'``, ``'[0, 1]'``, ``'[0, 1)'``), and
    argparse's ``type``, ``action``, ``metavar``, ``dest``, ``required``."""
    return field(default=default, default_factory=factory, metadata={'help': help, **meta})


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One option per field of ``cls`` made by :func:`option`. Every option defaults to
    ``None`` (not given); its help ends with the field's default (``default: X``)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if 'help' not in f.metadata:
            continue
        meta, text = dict(f.metadata), f.metadata['help']
        hint = hints[f.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = [t for t in (typing.get_args(hint) if union else (hint,)) if t is not type(None)]
        flag = meta.pop('flag', None)
        meta.pop('bounds', None)
        if kinds == [bool] and 'action' not in meta:
            meta['action'] = 'store_true' if f.default is False else 'store_false'
            flag = flag or ('--' if f.default is False else '--no-') + f.name.replace('_', '-')
        elif len(kinds) == 1 and kinds[0] in (int, float, Path) and 'type' not in meta:
            meta['type'] = kinds[0]
        shown = f.default if f.default is not MISSING else None
        flag_only = meta.get('action') in ('store_true', 'store_false')
        if shown is not None and not flag_only and 'default' not in text.lower():
            shown = f'default: {format_default(shown)}'
            text = f'{text} ({shown})' if text else shown
        meta.setdefault('dest', f.name)
        parser.add_argument(flag or '--' + f.name.replace('_', '-'), default=None,
                            **{**meta, 'help': text.replace('%', '%%') or None})


def _in_bounds(value: float, bounds: str) -> bool:
    if bounds[0] in '[(':
        low, high = (float(x) for x in bounds[1:-1].split(','))
        return ((low <= value if bounds[0] == '[' else low < value)
                and (value <= high if bounds[-1] == ']' else value < high))
    op, bound = bounds.split()
    return value >= float(bound) if op == '>=' else value > float(bound)


def check_options(settings: Any) -> None:
    """``ValueError`` for a field of ``settings`` out of its declared ``choices`` or
    ``bounds`` (a number must be finite too); ``None`` passes where it is the default."""
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value is None and f.default is None:
            continue
        choices, bounds = f.metadata.get('choices'), f.metadata.get('bounds')
        if choices is not None and value not in choices:
            raise ValueError(f'unknown {f.name} {value!r}, expected one of {tuple(choices)}')
        if bounds and not (isinstance(value, (int, float)) and math.isfinite(value)
                           and _in_bounds(value, bounds)):
            where = 'in ' if bounds[0] in '[(' else ''
            raise ValueError(f'{f.name} must be {where}{bounds}, got {value!r}')
