"""Span expressions (core.spans): the grammar, its messages, and what a KV cache finds of
requests asked in order, position-dependent and position-independent, worked by hand."""

from pathlib import Path

import pytest

from xbench.core.spans import (
    Gen,
    Name,
    Seq,
    Set,
    SpanSyntaxError,
    calls,
    context_for_ratio,
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
        ("gen(a)", 6, "'+' or '->' (gen(input -> output))", "')'"),
        ("gen(a -> )", 10, "the output's name after '->'", "')'"),
        ("gen(a -> b", 11, "')' after the output's name", "the end"),
        ("a -> b", 3, "'+' or the end", "'->'"),
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
    def prefill(n, context=0):
        return 1e-4 + n * 1e-6 + n * (n + 2 * context) * 1e-9

    rows = hit_rates(
        ["system + {d1, d2} + q1", "system + {d2, d1} + q2"],
        block=2,
        lengths=LENGTHS,
        prefill=prefill,
    )
    assert rows[0]["ttft_dependent_s"] == pytest.approx(prefill(127))
    # what missed, attending what hit: one call's fixed cost, its tokens, their pairs
    assert rows[1]["ttft_dependent_s"] == pytest.approx(prefill(107, 20))
    assert rows[1]["ttft_independent_s"] == pytest.approx(prefill(7, 120))
    assert "ttft_dependent_s" not in hit_rates(["{a}"])[0]  # no prefill terms: no TTFT
    with pytest.raises(ValueError):
        hit_rates(["{a}"], block=0)


def test_a_call_parses_and_stands_for_its_output_where_it_is_written():
    tree = parse("gen(judge + {gen(s + q -> a1), gen(s + q -> a2)} -> verdict)")
    generator = Gen(Seq((Name("s"), Name("q"))), "a1")
    assert tree.input.parts[1].members[0] == generator
    assert render(tree) == "gen(judge + {gen(s + q -> a1), gen(s + q -> a2)} -> verdict)"
    # three calls, the inner ones first; the judge reads the answers by name
    assert [(render(i), o) for i, o in calls(tree)] == [
        ("s + q", "a1"),
        ("s + q", "a2"),
        ("judge + {a1, a2}", "verdict"),
    ]
    assert calls(parse("s + {a, b}")) == [(parse("s + {a, b}"), None)]
    # "gen" not followed by "(" is a name; a name may hold "-" but not end in it before ">"
    assert parse("gen + x-y") == Seq((Name("gen"), Name("x-y")))
    assert parse("gen(a->b)") == Gen(Name("a"), "b")
    assert names(tree) == ["judge", "s", "q", "a1", "s", "q", "a2", "verdict"]
    # where it is written a call stands for its output, as calls() reads it
    assert positional_and_shared(parse("gen(s + {d1} -> a) + q")) == (["a", "q"], [])
    for expr in ("gen(a -> b) + gen(c -> b)", "gen(a + b -> b)", "{gen(a -> x), x}"):
        with pytest.raises(ValueError, match="generated twice or also read as data"):
            parse(expr)


# The paper's three worked examples (its figure captions; a block holds 2 tokens): what the
# prefix cache (position-dependent) finds of the request each caption counts.
def _caption(exprs, lengths, dual_output=True):
    return hit_rates(exprs, block=2, lengths=lengths, dual_output=dual_output)


def test_caption_chat_second_turn_finds_4_of_5_and_tends_to_all():
    lengths = {"u1": 2, "a1": 2, "u2": 1, "a2": 2, "u3": 1}
    turns = ["gen(u1 -> a1)", "gen(u1 + a1 + u2 -> a2)"]
    second = _caption(turns, lengths)[1]
    assert (second["hit_tokens_dependent"], second["tokens"]) == (4, 5)
    assert second["hit_rate_dependent"] == pytest.approx(0.8)
    # the answer's KV is what the server generated: without dual output only u1 is found
    assert _caption(turns, lengths, dual_output=False)[1]["hit_tokens_dependent"] == 2
    # the chat goes on: each turn finds more of itself
    rates = [
        r["hit_rate_dependent"]
        for r in _caption(
            [*turns, "gen(u1 + a1 + u2 + a2 + u3 -> a3)"], {**lengths, "u2": 2, "u3": 2}
        )
    ]
    assert rates[0] == 0 and rates[1] < rates[2] < 1


def test_caption_rag_second_request_finds_2_of_6_and_tends_to_none():
    exprs = ["s + {F1, F2} + q1", "s + {F2, F1} + q2"]
    lengths = {"s": 2, "F1": 1, "F2": 1, "q1": 2, "q2": 2}
    second = _caption(exprs, lengths)[1]
    assert (second["hit_tokens_dependent"], second["tokens"]) == (2, 6)
    assert second["hit_rate_dependent"] == pytest.approx(1 / 3)
    grown = _caption(exprs, {**lengths, "F1": 1000, "F2": 1000})[1]
    assert grown["hit_rate_dependent"] < 0.001
    # the documents in any order are what span caching finds: it tends to all instead
    assert grown["hit_rate_independent"] > 0.99


def test_caption_nested_generation_judge_finds_2_of_7_and_tends_to_none():
    expr = "gen(s + {gen(s + u -> a1), gen(s + u -> a2)} + j -> verdict)"
    lengths = {"s": 2, "u": 2, "a1": 2, "a2": 2, "j": 1}
    rows = _caption([expr], lengths)
    assert [r["request"] for r in rows] == [0, 0, 0]
    assert [r["output"] for r in rows] == ["a1", "a2", "verdict"]
    judge = rows[2]
    assert (judge["hit_tokens_dependent"], judge["tokens"]) == (2, 7)
    assert judge["hit_rate_dependent"] == pytest.approx(2 / 7)
    # the second generator repeats the first's input: found whole
    assert rows[1]["hit_rate_dependent"] == 1
    grown = _caption([expr], {**lengths, "a1": 1000, "a2": 1000})[2]
    assert grown["hit_rate_dependent"] < 0.001
    # the generated answers' KV reused inside the judge's set (dual output): the system
    # prompt and both answers, the judge's last token in a partial block recomputed
    assert judge["hit_tokens_independent"] == 6
    assert grown["hit_rate_independent"] > 0.99
    alone = _caption([expr], lengths, dual_output=False)[2]
    assert alone["hit_tokens_independent"] == 2 and alone["hit_tokens_dependent"] == 2


def test_simulate_prints_each_expressions_hit_rates(xbench, tmp_path):
    scenario = tmp_path / "rag.toml"
    scenario.write_text(
        '[scenario]\nname = "rag"\nmodel = "deepseek-v3.2"\n[workload]\ninstances = 2\n'
        'chunk_tokens = 64\nrate = "100/s"\nfabric = "ib"\nblock_tokens = 2\n'
        "span_tokens = { system = 20, d1 = 50, d2 = 50, q1 = 7, q2 = 7 }\n"
        'spans = [{ expr = "system + {d1, d2} + q1" }, { expr = "system + {d2, d1} + q2" }]\n'
    )
    r = xbench("simulate", str(scenario), "--requests", "200", env={"COLUMNS": "200"})
    lines = [line for line in r.stdout.splitlines() if line.strip().startswith("system + {d2, d1}")]
    assert len(lines) == 1, r.stdout
    cells = lines[0].split()
    assert "127" in cells and "16%" in cells and "94%" in cells, lines[0]
    assert "span hit rates" in r.stdout and "whole blocks of 2 tokens" in r.stdout


def test_the_context_a_ratio_needs_is_worked_out_by_hand():
    # matmuls only (1 s a token): (C + q) / q = 10 at C = 9 q
    def linear(n, context=0):
        return float(n)

    assert context_for_ratio(linear, 100, 10) == pytest.approx(900, abs=1)

    # attention only (1 s a pair): (C + q)^2 / (q (q + 2 C)) = 10 at C^2 - 18 q C - 9 q^2 = 0
    def pairs(n, context=0):
        return n * (n + 2 * context)

    q = 100
    assert context_for_ratio(pairs, q, 10) == pytest.approx(q * (9 + 90**0.5), abs=1)

    # a fixed time per call of 1000 s caps the ratio while the call is short
    def fixed(n, context=0):
        return 1000 + n

    assert context_for_ratio(fixed, 1, 10) == pytest.approx(9 * 1001, abs=1)
    assert context_for_ratio(fixed, 1, 10, most=1000) is None
    assert context_for_ratio(linear, 100, 1) == 0
    # a root below ``most`` is found even where doubling would pass it; none past it
    assert context_for_ratio(linear, 100, 10, most=1000) == pytest.approx(900, abs=1)
    assert context_for_ratio(linear, 100, 10, most=800) is None
    assert context_for_ratio(lambda n, context=0: float("inf"), 100, 10) is None


def test_a_name_generated_again_must_be_the_same_call():
    # asked again, the same call generates the same tokens; another input cannot reuse it
    same = hit_rates(["gen(s + q -> a)", "gen(s + q -> a)", "{a, d} + q2"], block=1)
    assert same[1]["hit_rate_dependent"] == 1
    with pytest.raises(ValueError, match="a is generated from s \\+ q and from x"):
        hit_rates(["gen(s + q -> a)", "gen(x -> a)"])


def test_a_scenario_that_generates_a_name_from_two_inputs_is_refused(xbench, tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(
        '[scenario]\nname = "two"\nmodel = "deepseek-v3.2"\n[workload]\ninstances = 2\n'
        'chunk_tokens = 64\nrate = "100/s"\nfabric = "ib"\n'
        'spans = [{ expr = "gen(s + {d1} -> a)" }, { expr = "gen(t + {d2} -> a)" }]\n'
    )
    r = xbench("simulate", path, "--requests", "100")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "a is generated from s + {d1} and from t + {d2}" in line, line


def test_simulate_runs_nested_generation_and_reuses_what_it_generated(xbench, tmp_path):
    """span-generation: the judge's candidates are generated by inner calls and found in its
    set (dual output); the chat turn finds the answer it continues; without dual output
    neither is found. The 10-20x table's contexts give those ratios on the profile."""
    import json

    from xbench.core.parts import prefill_time
    from xbench.core.profile import load_profile
    from xbench.resources import profile_path

    shipped = Path(__file__).resolve().parents[1] / "scenarios" / "span-generation.toml"
    r = xbench("simulate", "span-generation", "--requests", "300", "--format", "json")
    tables = json.loads(r.stdout)
    calls_ = tables["span_hits"]
    assert [c["request"] for c in calls_] == [0, 1, 2, 3, 3, 3]
    assert [c["output"] for c in calls_] == ["a1", "a2", "a3", "c1", "c2", "verdict"]
    chat, judge = calls_[2], calls_[5]
    assert chat["hit_tokens_dependent"] == chat["tokens"] - 128  # all but q3
    assert judge["expr"] == "gen(judge + {c1, c2} -> verdict)"
    assert (judge["hit_tokens_dependent"], judge["hit_tokens_independent"]) == (0, 2048)
    for c in calls_:  # the TTFT is its terms' sum; the ratio is of the two TTFTs
        for label in ("dependent", "independent"):
            terms = sum(c[f"ttft_{label}_{t}_s"] for t in ("fixed", "matmul", "attention"))
            assert c[f"ttft_{label}_s"] == pytest.approx(terms)
            assert c[f"ttft_{label}_s"] > 0  # a call always computes its last token
        assert c["ttft_ratio"] == pytest.approx(c["ttft_dependent_s"] / c["ttft_independent_s"])
    device = load_profile(profile_path("h100-priors")).device
    layers, gpus = calls_[0]["prefill_layers"], calls_[0]["prefill_gpus"]
    reach = tables["span_ttft_reach"]
    assert {(row["new_tokens"], row["ratio"]) for row in reach} >= {(256, 10.0), (256, 20.0)}
    for row in reach:
        new, context = row["new_tokens"], row["context_tokens"]
        whole = prefill_time(device, context + new, 0, layers=layers, gpus=gpus)
        after = prefill_time(device, new, context, layers=layers, gpus=gpus)
        assert whole / after == pytest.approx(row["ratio"], rel=1e-3)

    # the README quotes these figures
    readme = (shipped.parents[1] / "README.md").read_text()
    said = " ".join(readme.split())
    dependent = sum(c["ttft_dependent_s"] for c in calls_)
    independent = sum(c["ttft_independent_s"] for c in calls_)
    warm = [c for c in calls_ if c["hit_tokens_independent"] > 0]
    warm_ratio = sum(c["ttft_dependent_s"] for c in warm) / sum(
        c["ttft_independent_s"] for c in warm
    )
    x10, x20 = (row["context_tokens"] for row in reach if row["new_tokens"] == 256 and row["ratio"])
    assert (
        f"sums to {dependent:.2f} s under prefix caching and {independent:.2f} s under span "
        f"caching, x{warm_ratio:.1f} over the {len(warm)} calls"
    ) in said
    assert f"about {round(x10, -2):,.0f} cached tokens before a 256-token question" in said
    assert f"20x about {round(x20, -2):,.0f}" in said

    text = shipped.read_text().replace(
        "block_tokens = 64", "block_tokens = 64\ndual_output = false"
    )
    alone = tmp_path / "alone.toml"
    alone.write_text(text)
    r = xbench("simulate", alone, "--requests", "300", "--format", "json")
    calls_ = json.loads(r.stdout)["span_hits"]
    assert calls_[2]["hit_tokens_dependent"] == calls_[2]["tokens"] - 512 - 128  # a2, q3
    assert calls_[5]["hit_tokens_independent"] == 0
