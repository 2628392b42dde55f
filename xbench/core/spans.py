"""Span expressions (span queries, arXiv 2511.02749; spnl's ``seq`` and ``plus``) and what a
KV cache finds of them.

Grammar (``+`` joins parts in sequence; braces hold parts that commute)::

    expr  := seq
    seq   := part ("+" part)*
    part  := NAME | "{" seq ("," seq)* [","] "}"
    NAME  := [A-Za-z0-9_./:-]+

So ``system + tools + {a, b}`` (several prefixes), ``system + {a, b} + question`` (RAG's
question after its documents) and ``{a, {b, c}}`` (nested sets) all parse. A set's members
are position-independent: each member's KV is computed from its own start (block attention)
and serves any request that names it, wherever it sits; the parts outside braces are
positional, their KV depends on everything before them.

Hit rates: for requests asked in order, the share of each request's tokens whose KV the cache
already holds, from the requests before it (the cache keeps everything), in whole blocks of
``block`` tokens (a partial block is recomputed, as vLLM's prefix cache does):

- position-dependent (prefix caching): the request's tokens in written order, one stream;
  a block hits where the same tokens were cached behind the same prefix;
- position-independent (span queries): each set member is a stream of its own, from its own
  start; the positional parts are a stream in which each earlier set counts by its members,
  in any order (commuting: ``{a, b}`` then ``q`` is ``{b, a}`` then ``q``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9_./:-]+)|(\S))")


class SpanSyntaxError(ValueError):
    """A span expression that does not parse: ``column`` (1-based) and what was expected."""

    def __init__(self, expr: str, column: int, expected: str, found: str):
        self.expr, self.column = expr, column
        super().__init__(f"at column {column}: expected {expected}, found {found}")


@dataclass(frozen=True)
class Name:
    name: str


@dataclass(frozen=True)
class Seq:
    parts: tuple  # Name | Set, two or more


@dataclass(frozen=True)
class Set:
    members: tuple  # Name | Seq | Set, one or more


def _lex(expr: str) -> list[tuple[str, str, int]]:
    """(kind, text, column) of each token: kind "name" or the character; an "end" last."""
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:  # trailing blanks
            break
        column = m.start(1 if m.group(1) is not None else 2) + 1
        out.append(("name", m.group(1), column) if m.group(1) else (m.group(2), m.group(2), column))
        pos = m.end()
    out.append(("end", "", len(expr.rstrip()) + 1))
    return out


def parse(expr: str):
    """The expression's tree (Name, Seq or Set); SpanSyntaxError where it is wrong."""
    tokens, i = _lex(expr), 0

    def found(tok) -> str:
        return "the end" if tok[0] == "end" else repr(tok[1])

    def seq():
        nonlocal i
        parts = [part()]
        while tokens[i][0] == "+":
            i += 1
            parts.append(part())
        return parts[0] if len(parts) == 1 else Seq(tuple(parts))

    def part():
        nonlocal i
        tok = tokens[i]
        if tok[0] == "name":
            i += 1
            return Name(tok[1])
        if tok[0] != "{":
            raise SpanSyntaxError(expr, tok[2], "a name or '{'", found(tok))
        i += 1
        members = [seq()]
        while tokens[i][0] == ",":
            i += 1
            if tokens[i][0] == "}":  # a trailing comma
                break
            members.append(seq())
        if tokens[i][0] != "}":
            raise SpanSyntaxError(expr, tokens[i][2], "',', '+' or '}'", found(tokens[i]))
        i += 1
        return Set(tuple(members))

    tree = seq()
    if tokens[i][0] != "end":
        raise SpanSyntaxError(expr, tokens[i][2], "'+' or the end", found(tokens[i]))
    return tree


def names(tree) -> list[str]:
    """Every name in written order (repeats kept)."""
    if isinstance(tree, Name):
        return [tree.name]
    parts = tree.parts if isinstance(tree, Seq) else tree.members
    return [n for p in parts for n in names(p)]


def positional_and_shared(tree) -> tuple[list[str], list[str]]:
    """(the names outside braces, the names inside any braces), each in written order."""
    if isinstance(tree, Set):
        return [], names(tree)
    if isinstance(tree, Name):
        return [tree.name], []
    outside, inside = [], []
    for p in tree.parts:
        o, s = positional_and_shared(p)
        outside += o
        inside += s
    return outside, inside


def render(tree) -> str:
    if isinstance(tree, Name):
        return tree.name
    if isinstance(tree, Seq):
        return " + ".join(render(p) for p in tree.parts)
    return "{" + ", ".join(render(m) for m in tree.members) + "}"


# ---- what a cache finds ----


def _tokens(name: str, lengths, default: int) -> list[tuple[str, int]]:
    return [(name, j) for j in range(int(lengths.get(name, default)))]


def _canonical(tree) -> str:
    """A set's content whatever its members' order (nested sets too)."""
    if isinstance(tree, Name):
        return tree.name
    if isinstance(tree, Seq):
        return "(" + "+".join(_canonical(p) for p in tree.parts) + ")"
    return "{" + ",".join(sorted(_canonical(m) for m in tree.members)) + "}"


def _streams(tree, independent: bool, lengths, default: int) -> list[tuple[str, list]]:
    """The token streams a request caches in: (root, tokens), each cached in blocks chained
    from its root. Position-dependent: one stream, written order. Position-independent:
    each set member its own stream (rooted at its own content), and the positional parts
    one stream in which a set stands for its canonical content (zero tokens of its own)."""
    if not independent:
        return [("", [t for n in names(tree) for t in _tokens(n, lengths, default)])]
    streams: list[tuple[str, list]] = []

    def scope(node, root: str) -> None:
        parts = node.parts if isinstance(node, Seq) else (node,)
        mine: list = []
        for p in parts:
            if isinstance(p, Name):
                mine += _tokens(p.name, lengths, default)
            else:  # a set: its members stream on their own; here, its content by name
                for m in p.members:
                    scope(m, "member:" + _canonical(m))
                mine.append(("set:" + _canonical(p), -1))
        streams.append((root, mine))

    scope(tree, "")
    return streams


def _blocks(root: str, tokens: list, block: int):
    """(chain key, tokens in the block) of each whole block; a set marker carries no token
    but enters the chain (what follows it depends on it)."""
    key, count, pending = root, 0, []
    for tok in tokens:
        pending.append(tok)
        if tok[1] >= 0:
            count += 1
        if count == block:
            key = hash((key, tuple(pending)))
            yield key, count
            count, pending = 0, []


def hit_rates(
    exprs, *, block: int = 16, lengths=None, default_tokens: int = 1, prefill=None
) -> list[dict]:
    """Per expression (strings or trees), asked in order against the cache the earlier ones
    left: tokens, the tokens the cache held, and the hit rate, position-dependent and
    position-independent (``lengths``: tokens per name; others ``default_tokens``). With
    ``prefill`` (seconds to prefill n tokens, the profile's T_recompute), the time to first
    token: prefilling what missed after what hit, ``prefill(tokens) - prefill(hits)``, as if
    the hits came first (for position-independent caching an upper bound: its members'
    tokens attend within their member only)."""
    if block < 1:
        raise ValueError("block must be at least 1 token")
    lengths = lengths or {}
    caches = {False: set(), True: set()}
    out = []
    for expr in exprs:
        tree = parse(expr) if isinstance(expr, str) else expr
        total = sum(int(lengths.get(n, default_tokens)) for n in names(tree))
        row = {"expr": render(tree), "tokens": total}
        for independent, label in ((False, "dependent"), (True, "independent")):
            cache, hits, seen = caches[independent], 0, []
            for root, tokens in _streams(tree, independent, lengths, default_tokens):
                for key, count in _blocks(root, tokens, block):
                    hits += count if key in cache else 0
                    seen.append(key)
            cache.update(seen)
            row[f"hit_tokens_{label}"] = hits
            row[f"hit_rate_{label}"] = hits / total if total else 0.0
            if prefill is not None:
                row[f"ttft_{label}_s"] = prefill(total) - prefill(hits)
        out.append(row)
    return out
