"""Shell patterns for job names (`gpuq queue --name 'sweep*'`), read once and written three
ways, so the in-memory live listing and both databases select exactly the same jobs:

- a Python regex (the live jobs in the coordinator's memory),
- an SQLite GLOB pattern (native, case-sensitive, uses an index-free scan in C),
- a POSIX regex for PostgreSQL's `~` (it has no GLOB; LIKE cannot say `[a-c]`).

The syntax is fnmatch's: `*`, `?`, `[abc]`, `[a-z]`, `[!abc]`; an unclosed `[` is a literal.
Case-sensitive everywhere (fnmatchcase), as a name is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STAR, ANY, LITERAL, CLASS = "star", "any", "literal", "class"


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str = ""  # LITERAL: one character; CLASS: the bracket's body (ranges kept)
    negated: bool = False


def tokens(pattern: str) -> tuple[Token, ...]:
    """The pattern as fnmatch reads it (fnmatch.translate's rules for brackets)."""
    out: list[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char == "*":
            if not out or out[-1].kind != STAR:  # `**` is `*`
                out.append(Token(STAR))
        elif char == "?":
            out.append(Token(ANY))
        elif char == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal `[`
                out.append(Token(LITERAL, "["))
                continue
            body = pattern[i:j]
            i = j + 1
            negated = body.startswith("!")
            out.append(Token(CLASS, body[1:] if negated else body, negated))
        else:
            out.append(Token(LITERAL, char))
    return tuple(out)


def _regex_class(token: Token) -> str:
    """A bracket for Python's re and PostgreSQL alike: every ASCII character that is not a
    letter, a digit or a range's `-` escaped (both read `\\]` as a literal `]`)."""
    body = "".join(
        c if c == "-" or not c.isascii() or c.isalnum() else "\\" + c for c in token.text
    )
    if not body:  # `[!]`... can't be reached from tokens(); keep regexes valid anyway
        return "(?!)" if not token.negated else "."
    return "[" + ("^" if token.negated else "") + body + "]"


def to_regex(pattern: str) -> str:
    """A Python regex (for re.fullmatch) with fnmatchcase's meaning."""
    parts = []
    for t in tokens(pattern):
        if t.kind == STAR:
            parts.append(".*")
        elif t.kind == ANY:
            parts.append(".")
        elif t.kind == LITERAL:
            parts.append(re.escape(t.text))
        else:
            parts.append(_regex_class(t))
    return "(?s:" + "".join(parts) + ")"


def to_posix_regex(pattern: str) -> str:
    """An anchored POSIX (PostgreSQL ARE) regex: a backslash before a character that is not
    a letter or a digit makes it literal there, inside brackets too."""
    parts = ["^"]
    for t in tokens(pattern):
        if t.kind == STAR:
            parts.append(".*")
        elif t.kind == ANY:
            parts.append(".")
        elif t.kind == LITERAL:
            char = t.text
            parts.append(char if char.isalnum() or not char.isascii() else "\\" + char)
        else:
            parts.append(_regex_class(t))
    parts.append("$")
    return "".join(parts)


def to_glob(pattern: str) -> str:
    """SQLite's GLOB: `*`, `?` and `[...]` as fnmatch's, `[^...]` for negation; a literal
    `*`, `?` or `[` is a one-character class (GLOB has no escape character)."""
    parts = []
    for t in tokens(pattern):
        if t.kind == STAR:
            parts.append("*")
        elif t.kind == ANY:
            parts.append("?")
        elif t.kind == LITERAL:
            parts.append(f"[{t.text}]" if t.text in "*?[" else t.text)
        else:
            body = t.text
            if not t.negated and body.startswith("^"):  # GLOB would read it as a negation
                body = body[1:] + "^" if len(body) > 1 else ""
                if not body:
                    parts.append("^")
                    continue
            parts.append("[" + ("^" if t.negated else "") + body + "]")
    return "".join(parts)


def compile_patterns(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex matching a name that any of `patterns` matches (None: no patterns)."""
    if not patterns:
        return None
    return re.compile("|".join(to_regex(p) for p in patterns))
