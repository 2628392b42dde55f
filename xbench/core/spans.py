"""Span expressions (span queries, arXiv 2511.02749; spnl's ``seq`` and ``plus``) and what a
KV cache finds of them.

Grammar (``+`` joins parts in sequence; braces hold parts that commute; ``gen`` is an
inference call, the paper's ``g``)::

    expr  := seq
    seq   := part ("+" part)*
    part  := NAME | "{" seq ("," seq)* [","] "}" | "gen" "(" seq "->" NAME ")"
    NAME  := letters, digits and _ . / : - (a name does not end in "-" before ">")

So ``system + tools + {a, b}`` (several prefixes), ``system + {a, b} + question`` (RAG's
question after its documents) and ``{a, {b, c}}`` (nested sets) all parse. A set's members
are position-independent: each member's KV is computed from its own start (block attention)
and serves any request that names it, wherever it sits; the parts outside braces are
positional, their KV depends on everything before them.

``gen(system + user -> answer)`` is a call that reads its input and generates ``answer``;
written inside another expression it stands for its output, so a judge over two generated
answers is ``gen(judge + {gen(s + q -> a1), gen(s + q -> a2)} -> verdict)``: three calls,
the inner ones first. A later expression may name ``answer`` as data (a chat's next turn:
``system + user + answer + user2``).

Hit rates: for calls asked in order, the share of each call's input tokens whose KV the cache
already holds, from the calls before it (the cache keeps everything), in whole blocks of
``block`` tokens (a partial block is recomputed, as vLLM's prefix cache does):

- position-dependent (prefix caching): the request's tokens in written order, one stream;
  a block hits where the same tokens were cached behind the same prefix;
- position-independent (span queries): each set member is a stream of its own, from its own
  start; the positional parts are a stream in which each earlier set counts by its members,
  in any order (commuting: ``{a, b}`` then ``q`` is ``{b, a}`` then ``q``).

Dual output (the paper's point, on unless turned off): the server returns a call's output as
text but keeps its KV. Under either cache the output continues the call's own stream, so a
later call that repeats the input and then the output (a chat's next turn) finds both; under
position-independent caching the output is also held as a member of its own, its KV reused
wherever it sits, as the paper reuses a generated answer inside a later call's set (an
approximation of the same kind as block attention's: the answer's KV attended its prompt).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(->)|((?:[A-Za-z0-9_./:]|-(?!>))+)|(\S))")


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
    parts: tuple  # Name | Set | Gen, two or more


@dataclass(frozen=True)
class Set:
    members: tuple  # Name | Seq | Set | Gen, one or more


@dataclass(frozen=True)
class Gen:
    """An inference call: reads ``input``, generates the tokens named ``output``."""

    input: object  # Name | Seq | Set | Gen
    output: str


def _lex(expr: str) -> list[tuple[str, str, int]]:
    """(kind, text, column) of each token: kind "name", "->" or the character; an "end"
    last."""
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:  # trailing blanks
            break
        group = m.lastindex
        column, text = m.start(group) + 1, m.group(group)
        out.append(("name" if group == 2 else text, text, column))
        pos = m.end()
    out.append(("end", "", len(expr.rstrip()) + 1))
    return out


def parse(expr: str):
    """The expression's tree (Name, Seq, Set or Gen); SpanSyntaxError where it is wrong, a
    ValueError where a call's output is named twice (:func:`_check_outputs`)."""
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

    def expect(kind: str, what: str):
        nonlocal i
        if tokens[i][0] != kind:
            raise SpanSyntaxError(expr, tokens[i][2], what, found(tokens[i]))
        i += 1
        return tokens[i - 1][1]

    def part():
        nonlocal i
        tok = tokens[i]
        if tok[0] == "name" and tok[1] == "gen" and tokens[i + 1][0] == "(":
            i += 2
            call_input = seq()
            expect("->", "'+' or '->' (gen(input -> output))")
            output = expect("name", "the output's name after '->'")
            expect(")", "')' after the output's name")
            return Gen(call_input, output)
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
        expect("}", "',', '+' or '}'")
        return Set(tuple(members))

    tree = seq()
    if tokens[i][0] != "end":
        raise SpanSyntaxError(expr, tokens[i][2], "'+' or the end", found(tokens[i]))
    _check_outputs(tree)
    return tree


def _check_outputs(tree) -> None:
    """A call's output is new tokens: ValueError where an expression generates a name twice
    or also reads it as data (which tokens would the name be?)."""
    outputs: list[str] = []
    read: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, Name):
            read.add(node.name)
        elif isinstance(node, Gen):
            walk(node.input)
            outputs.append(node.output)
        else:
            for child in node.parts if isinstance(node, Seq) else node.members:
                walk(child)

    walk(tree)
    twice = sorted({o for o in outputs if outputs.count(o) > 1} | (set(outputs) & read))
    if twice:
        raise ValueError(
            f"{', '.join(twice)} generated twice or also read as data: name each call's "
            "output anew (gen(input -> a new name))"
        )


def names(tree) -> list[str]:
    """Every name in written order (repeats kept); a call's output after its input."""
    if isinstance(tree, Name):
        return [tree.name]
    if isinstance(tree, Gen):
        return names(tree.input) + [tree.output]
    parts = tree.parts if isinstance(tree, Seq) else tree.members
    return [n for p in parts for n in names(p)]


def positional_and_shared(tree) -> tuple[list[str], list[str]]:
    """(the names outside braces, the names inside any braces), each in written order."""
    if isinstance(tree, Set):
        return [], names(tree)
    if isinstance(tree, Name):
        return [tree.name], []
    if isinstance(tree, Gen):  # a call stands for its output where it is written (calls)
        return [tree.output], []
    outside, inside = [], []
    for p in tree.parts:
        o, s = positional_and_shared(p)
        outside += o
        inside += s
    return outside, inside


def render(tree) -> str:
    if isinstance(tree, Name):
        return tree.name
    if isinstance(tree, Gen):
        return f"gen({render(tree.input)} -> {tree.output})"
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


def calls(tree) -> list[tuple[object, str | None]]:
    """The inference calls an expression makes, in the order they run (a call's inner calls
    first, in written order): (its input, with each inner call replaced by its output's name;
    its output's name, or None for an expression that is not itself a call)."""
    out: list[tuple[object, str | None]] = []

    def lower(node):
        if isinstance(node, Name):
            return node
        if isinstance(node, Gen):
            out.append((lower(node.input), node.output))
            return Name(node.output)
        if isinstance(node, Seq):
            return Seq(tuple(lower(p) for p in node.parts))
        return Set(tuple(lower(m) for m in node.members))

    top = lower(tree.input if isinstance(tree, Gen) else tree)
    out.append((top, tree.output if isinstance(tree, Gen) else None))
    return out


def check_generated(trees) -> None:
    """ValueError where expressions generate one name from different inputs (the same
    name would be two token streams); the same call asked again generates the same."""
    made: dict[str, str] = {}
    for tree in trees:
        for call_input, output in calls(tree):
            if output is None:
                continue
            shown = render(call_input)
            if made.setdefault(output, shown) != shown:
                raise ValueError(
                    f"{output} is generated from {made[output]} and from {shown}: name each "
                    "call's output anew"
                )


def _left_cached(streams, output, independent, lengths, default, block) -> list:
    """The keys a call with ``output`` leaves besides its input's (dual output): the output
    continues the call's own positional stream (``streams``' last: the top scope's), and,
    position-independent, is held as a member of its own as well."""
    root, tokens = streams[-1]
    generated = _tokens(output, lengths, default)
    keys = [key for key, _ in _blocks(root, tokens + generated, block)]
    if independent:
        keys += [key for key, _ in _blocks("member:" + output, generated, block)]
    return keys


def prefilled_tokens(tokens: int, hits: int) -> tuple[int, int]:
    """(tokens prefilled, cached tokens they attend) of a call of ``tokens`` that found
    ``hits``: what missed, but never none: the last token is computed even when every block
    hit, its logits being the first token's (vLLM's prefix cache does the same)."""
    prefilled = max(tokens - hits, min(tokens, 1))
    return prefilled, tokens - prefilled


def hit_rates(
    exprs,
    *,
    block: int = 16,
    lengths=None,
    default_tokens: int = 1,
    prefill=None,
    dual_output: bool = True,
) -> list[dict]:
    """Per call of the expressions (strings or trees), asked in order against the cache the
    earlier calls left: the call's input tokens, those the cache held, and the hit rate,
    position-dependent and position-independent (``lengths``: tokens per name; others
    ``default_tokens``); ``request``: the expression's index, ``output``: what the call
    generates (None where the expression is data only). ``dual_output``: a call's generated
    KV stays in the cache (see the module's note). With ``prefill(tokens, context)``
    (seconds to prefill ``tokens`` after ``context`` cached ones, which they attend), the
    time to first token: prefilling what missed after what hit, at least the last token
    (:func:`prefilled_tokens`; for position-independent caching an upper bound: its members'
    tokens attend within their member only)."""
    if block < 1:
        raise ValueError("block must be at least 1 token")
    lengths = lengths or {}
    caches = {False: set(), True: set()}
    out = []
    trees = [parse(expr) if isinstance(expr, str) else expr for expr in exprs]
    check_generated(trees)
    for request, tree in enumerate(trees):
        for call_input, output in calls(tree):
            total = sum(int(lengths.get(n, default_tokens)) for n in names(call_input))
            shown = render(call_input if output is None else Gen(call_input, output))
            row = {"request": request, "expr": shown, "output": output, "tokens": total}
            for independent, label in ((False, "dependent"), (True, "independent")):
                cache, hits, seen = caches[independent], 0, []
                streams = _streams(call_input, independent, lengths, default_tokens)
                for root, tokens in streams:
                    for key, count in _blocks(root, tokens, block):
                        hits += count if key in cache else 0
                        seen.append(key)
                if output is not None and dual_output:
                    seen += _left_cached(
                        streams, output, independent, lengths, default_tokens, block
                    )
                cache.update(seen)
                row[f"hit_tokens_{label}"] = hits
                row[f"hit_rate_{label}"] = hits / total if total else 0.0
                if prefill is not None:
                    row[f"ttft_{label}_s"] = prefill(*prefilled_tokens(total, hits))
            out.append(row)
    return out


def context_for_ratio(prefill, new_tokens: float, ratio: float, most: float = 1e9):
    """The tokens C a call must find under position-independent caching and miss under
    position-dependent caching for the latter's time to first token, ``prefill(C + q, 0)``,
    to be ``ratio`` times the former's, ``prefill(q, C)`` (``q``: ``new_tokens``, what both
    prefill; ``prefill(tokens, context)`` in seconds); None past ``most`` tokens or where
    the prefill has no finite cost. The ratio grows with C: about (C + q) / q while the
    matmuls lead, C / 2q once attention's pairs do; a call's fixed time raises the C a short
    call needs."""
    from scipy.optimize import brentq

    def gap(context: float) -> float:
        return prefill(context + new_tokens, 0.0) - ratio * prefill(new_tokens, context)

    start = gap(0.0)
    if not math.isfinite(start):
        return None
    if start >= 0:
        return 0.0
    high = min(max(float(new_tokens), 1.0), most)
    while gap(high) < 0:
        if high >= most:
            return None
        high = min(2 * high, most)
    return float(brentq(gap, 0.0, high, xtol=0.5))
