"""The messages docs/troubleshooting.md quotes are messages the code prints.

Each symptom there opens with the message a user sees, in double quotes inside the bold
head of its item (``- **"..."**``). The quote is looked up in the format strings of
``act_ros/`` (string literals and f-strings, parts joined with ``+`` taken together;
docstrings left out): the code's placeholders (``{value}``, a logging call's ``%s``) stand
for any text, and so does ``...`` in the quote. Each stretch of the quote between two
``...`` must be part of what one format string can produce, and at least half of its
characters must come from that string's own text, or from a whole string of the code a
placeholder stands for, of more than one word (``f'real time: {verdict.line()}'`` with
``'NOT feasible'``). A
message reworded in the code, or quoted from memory, fails here.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'troubleshooting.md'
ANY = None  # a placeholder: any text
PERCENT = re.compile(r'%[-+ #0-9.]*[sdifgrx]')
MIN_OWN_TEXT = 0.5


def quoted_messages(text: str) -> list[str]:
    """The double-quoted messages in the bold heads of the page's items."""
    heads = re.findall(r'^\s*- \*\*(.+?)\*\*', text, flags=re.M)
    return [quote for head in heads for quote in re.findall(r'"([^"]+)"', head)]


def _tokens(node: ast.AST) -> list[str | None] | None:
    """The characters of a string expression, ``ANY`` for each placeholder; ``None`` for an
    expression that is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        out: list[str | None] = []
        for i, part in enumerate(PERCENT.split(node.value)):
            out += ([ANY] if i else []) + list(part)
        return out
    if isinstance(node, ast.JoinedStr):
        out = []
        for value in node.values:
            out += list(value.value) if isinstance(value, ast.Constant) else [ANY]
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _tokens(node.left), _tokens(node.right)
        if left is None and right is None:
            return None
        return (left or [ANY]) + (right or [ANY])
    return None


@cache
def format_strings() -> tuple[list[list[str | None]], frozenset[str]]:
    """Every format string of the package as tokens, and the set of its plain strings."""
    formats, constants = [], set()
    for path in sorted((ROOT / 'act_ros').rglob('*.py')):
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        inside = set()  # the parts of a larger string expression
        for node in ast.walk(tree):
            if id(node) in docstrings or id(node) in inside:
                continue
            tokens = _tokens(node)
            if tokens is None:
                continue
            inside.update(id(child) for child in ast.walk(node) if child is not node)
            formats.append(tokens)
            if isinstance(node, ast.Constant) and ' ' in node.value.strip():
                constants.add(node.value)  # words, not a lone name
    return formats, frozenset(constants)


def own_text(fragment: str, tokens: list[str | None], constants: dict[int, list[int]]) -> int:
    """The most characters of ``fragment`` that come from ``tokens``' own text (or from a
    whole constant a placeholder stands for: ``constants``, start in ``fragment`` -> their
    lengths) when ``fragment`` is read as part of what ``tokens`` produce; -1 when it
    cannot be."""
    n = len(tokens)
    # states: token index -> best count; the fragment may start anywhere in the string.
    states = {j: 0 for j in range(n + 1)}
    pending: dict[tuple[int, int], int] = {}  # (end in fragment, token index) -> count
    for i, char in enumerate(fragment):
        states = _close(states, tokens)
        for (end, j), count in list(pending.items()):  # a whole constant ends here
            if end == i:
                states[j] = max(states.get(j, -1), count)
                del pending[(end, j)]
        states = _close(states, tokens)
        nxt: dict[int, int] = {}
        for j, count in states.items():
            if j < n and tokens[j] == char:
                nxt[j + 1] = max(nxt.get(j + 1, -1), count + 1)
            elif j < n and tokens[j] is ANY:
                nxt[j] = max(nxt.get(j, -1), count)  # inside the placeholder
                for length in constants.get(i, ()):
                    key = (i + length, j)
                    pending[key] = max(pending.get(key, -1), count + length)
        states = nxt
        if not states and not pending:
            return -1
    end = len(fragment)
    for (stop, j), count in pending.items():
        if stop == end:
            states[j] = max(states.get(j, -1), count)
    return max(states.values(), default=-1)


def _close(states: dict[int, int], tokens: list[str | None]) -> dict[int, int]:
    """A placeholder may also stand for no text: the state after it is reachable too."""
    out = dict(states)
    for j in sorted(states):
        k = j
        while k < len(tokens) and tokens[k] is ANY:
            k += 1
            out[k] = max(out.get(k, -1), out[j])
    return out


def found(fragment: str) -> bool:
    formats, strings = format_strings()
    constants: dict[int, list[int]] = {}
    for constant in strings:
        start = fragment.find(constant)
        while start >= 0:
            constants.setdefault(start, []).append(len(constant))
            start = fragment.find(constant, start + 1)
    words = re.findall(r'[A-Za-z_]{4,}', fragment)
    needed = MIN_OWN_TEXT * len(fragment)
    for tokens in formats:
        text = ''.join(t for t in tokens if t is not ANY)
        if words and not any(w in text for w in words):
            continue
        if own_text(fragment, tokens, constants) >= needed:
            return True
    return False


QUOTES = quoted_messages(PAGE.read_text())


def test_the_page_quotes_messages():
    assert len(QUOTES) >= 5, QUOTES


@pytest.mark.parametrize('quote', QUOTES)
def test_quoted_message_is_printed_by_the_code(quote):
    fragments = [f for f in (part.strip() for part in quote.split('...')) if len(f) > 2]
    missing = [f for f in fragments if not found(f)]
    assert not missing, (f'docs/troubleshooting.md quotes "{quote}": no format string in '
                         f'act_ros/ prints {missing}')


@pytest.mark.parametrize('quote,printed', [
    ("is missing joint(s) ['gripper'] (has ['a', 'b'])", True),
    ("missing joint 'gripper'", False),   # the quote this test was written for
    ('real time: NOT feasible', True),    # a placeholder that prints a constant
    ('real time: not possible', False),
    ('CUDA is not available', True),
    ('this message was never written', False),
])
def test_the_check_tells_printed_from_invented(quote, printed):
    assert all(found(f.strip()) for f in quote.split('...')) is printed
