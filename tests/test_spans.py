"""Span expressions (core.spans): the grammar, its messages, and what a KV cache finds of
requests asked in order, position-dependent and position-independent, worked by hand."""

import pytest

from xbench.core.spans import (
    Name,
    Seq,
    Set,
    SpanSyntaxError,
    hit_rates,
    names,
    parse,
    positional_and_shared,
    render,
)

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def test_the_papers_forms_parse():
    assert parse("system + tools + {a, b}") == Seq(
        (Name("system"), Name("tools"), Set((Name("a"), Name("b"))))
    )
    assert parse("system + {a, b} + question") == Seq(
        (Name("system"), Set((Name("a"), Name("b"))), Name("question"))
    )
    assert parse("{a, {b, c}}") == Set((Name("a"), Set((Name("b"), Name("c")))))
    # a member may itself be a sequence; a trailing comma is allowed; blanks are free
    assert parse(" {doc/1 + answer ,q2,} ") == Set(
        (Seq((Name("doc/1"), Name("answer"))), Name("q2"))
    )
    for expr in ("system + tools + {a, b}", "{a, {b, c + d}} + q", "x"):
        assert render(parse(expr)) == expr
    assert names(parse("s + {a, {b, c}} + q")) == ["s", "a", "b", "c", "q"]
    assert positional_and_shared(parse("s + {a, {b, c}} + q")) == (["s", "q"], ["a", "b", "c"])


@pytest.mark.parametrize(
    ("expr", "column", "expected", "found"),
    [
        ("system + {a b}", 13, "',', '+' or '}'", "'b'"),
        ("a +", 4, "a name or '{'", "the end"),
        ("{a, {b, c}", 11, "',', '+' or '}'", "the end"),
        ("+a", 1, "a name or '{'", "'+'"),
        ("a , b", 3, "'+' or the end", "','"),
        ("{}", 2, "a name or '{'", "'}'"),
        ("{a, }}", 6, "'+' or the end", "'}'"),
        ("a + #", 5, "a name or '{'", "'#'"),
    ],
)
def test_a_wrong_expression_says_where_and_what_was_expected(expr, column, expected, found):
    with pytest.raises(SpanSyntaxError) as e:
        parse(expr)
    assert e.value.column == column
    assert str(e.value) == f"at column {column}: expected {expected}, found {found}"


LENGTHS = {
    "system": 20,
    "user1": 30,
    "answer1": 40,
    "user2": 10,
    "d1": 50,
    "d2": 50,
    "q1": 7,
    "q2": 7,
}


def _rates(exprs, block=2, lengths=LENGTHS):
    rows = hit_rates(exprs, block=block, lengths=lengths)
    return [(r["hit_tokens_dependent"], r["hit_tokens_independent"], r["tokens"]) for r in rows]


def test_chats_second_turn_hits_its_first_turn_under_either_cache():
    # turn 2 repeats turn 1 (50 tokens) and adds the answer and a question (50): half hits
    assert _rates(["system + user1", "system + user1 + answer1 + user2"]) == [
        (0, 0, 50),
        (50, 50, 100),
    ]


def test_rags_documents_in_another_order_hit_only_where_positions_do_not_matter():
    first, shuffled = "system + {d1, d2} + q1", "system + {d2, d1} + q2"
    # prefix caching: the system prompt only (20 of 127); span caching: the system prompt
    # and both documents (120), the new question missing
    assert _rates([first, shuffled]) == [(0, 0, 127), (20, 120, 127)]
    # the same question after the same set in any order: the positional stream continues
    # through the set by its content, so the question hits in whole blocks (6 of its 7
    # tokens; the last sits in a partial block and is recomputed)
    assert _rates([first, "system + {d2, d1} + q1"])[1] == (20, 126, 127)


def test_nested_sets_cache_each_member_from_its_own_start():
    lengths = {"a": 4, "b": 3, "c": 5}
    # {a, {b, c}} then {{c, b}, a}: every member found wherever it sits; b's third token
    # and c's fifth are partial blocks of 2, recomputed: 4 + 2 + 4 = 10 of 12
    assert _rates(["{a, {b, c}}", "{{c, b}, a}"], lengths=lengths)[1] == (0, 10, 12)
    # prefix caching finds nothing: the first token differs
    # with one-token blocks every token of a reordered member hits
    assert _rates(["{a, {b, c}}", "{{c, b}, a}"], block=1, lengths=lengths)[1] == (0, 12, 12)
    # a new member beside known ones: only the known ones hit
    assert _rates(["{a, b}", "{a, c}"], lengths=lengths)[1] == (4, 4, 9)


def test_hit_rates_fall_as_new_documents_grow():
    """The paper's trend: with more (or longer) new documents beside the known ones, a
    request's hit rate falls."""
    seen = "system + {d1, d2} + q1"
    rates = []
    for new in (10, 100, 1000):
        rows = hit_rates(
            [seen, "system + {d2, d1, d3} + q2"], block=2, lengths={**LENGTHS, "d3": new}
        )
        rates.append(rows[1]["hit_rate_independent"])
    assert rates[0] > rates[1] > rates[2] > 0


def test_time_to_first_token_prefills_what_missed():
    def prefill(n):
        return n * 1e-6 + n * n * 1e-9

    rows = hit_rates(
        ["system + {d1, d2} + q1", "system + {d2, d1} + q2"],
        block=2,
        lengths=LENGTHS,
        prefill=prefill,
    )
    assert rows[0]["ttft_dependent_s"] == pytest.approx(prefill(127))
    assert rows[1]["ttft_dependent_s"] == pytest.approx(prefill(127) - prefill(20))
    assert rows[1]["ttft_independent_s"] == pytest.approx(prefill(127) - prefill(120))
    assert "ttft_dependent_s" not in hit_rates(["{a}"])[0]  # no prefill terms: no TTFT
    with pytest.raises(ValueError):
        hit_rates(["{a}"], block=0)


def test_simulate_prints_each_expressions_hit_rates(xbench, tmp_path):
    scenario = tmp_path / "rag.toml"
    scenario.write_text(
        '[scenario]\nname = "rag"\nmodel = "deepseek-v3.2"\n[workload]\ninstances = 2\n'
        'chunk_tokens = 64\nrate = "100/s"\nfabric = "ib"\nblock_tokens = 2\n'
        "span_tokens = { system = 20, d1 = 50, d2 = 50, q1 = 7, q2 = 7 }\n"
        'spans = [{ expr = "system + {d1, d2} + q1" }, { expr = "system + {d2, d1} + q2" }]\n'
    )
    r = xbench("simulate", str(scenario), "--requests", "200", env={"COLUMNS": "200"})
    lines = [line for line in r.stdout.splitlines() if "{d2, d1} + q2" in line]
    assert len(lines) == 1, r.stdout
    cells = lines[0].split()
    assert "127" in cells and "16%" in cells and "94%" in cells, lines[0]
    assert "span hit rates" in r.stdout and "whole blocks of 2 tokens" in r.stdout
