"""Template rendering: query variables are escaped PromQL string literals; actions get raw values."""

from __future__ import annotations

import pytest

from tailguard.controller.kit.templating import promql_selector, promql_string, render_query, render_text, variables_in


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ("plain", '"plain"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("two\nlines", '"two\\nlines"'),
        ("tab\there\rreturn", '"tab\\there\\rreturn"'),
        ('\\"', '"\\\\\\""'),  # a backslash then a quote: neither may close the literal
        ("", '""'),
    ],
)
def test_promql_string_escapes(value: str, literal: str) -> None:
    assert promql_string(value) == literal


def test_query_variable_cannot_break_out_of_its_literal() -> None:
    hostile = 'x"} or vector(1) or up{a="'
    query = render_query("up{job={{ job }}}", match={}, group_by=["service"], variables={"job": hostile})
    assert query == 'up{job="x\\"} or vector(1) or up{a=\\""}'


def test_selector_and_by_rendering() -> None:
    query = render_query(
        "sum by ({{ by }}) (rate(x{ {{selector}} }[1m])) > {{ floor }}",
        match={"namespace": "llm", "env": 'pr"od'},
        group_by=["service", "version"],
        variables={"floor": "0"},
    )
    assert query == 'sum by (service,version) (rate(x{ env="pr\\"od",namespace="llm" }[1m])) > "0"'


def test_match_labels_are_query_variables() -> None:
    query = render_query("x{ns={{ namespace }}}", match={"namespace": "llm"}, group_by=["s"], variables={})
    assert query == 'x{ns="llm"}'


def test_empty_selector() -> None:
    assert render_query("x{ {{ selector }} }", match={}, group_by=["a"], variables={}) == "x{  }"
    assert promql_selector({}) == ""


def test_selector_rejects_bad_label_names() -> None:
    with pytest.raises(ValueError, match="invalid label name 'bad-name'"):
        promql_selector({"bad-name": "x"})


def test_unknown_query_variable_raises_key_error() -> None:
    with pytest.raises(KeyError, match="missing"):
        render_query("x{a={{ missing }}}", match={}, group_by=["a"], variables={})


def test_actions_render_raw_values() -> None:
    text = render_text('{{service}} said "{{ msg }}"\\n', {"service": "chat", "msg": 'a "b"\nc'})
    assert text == 'chat said "a "b"\nc"\\n'


def test_unknown_action_variable_raises_key_error() -> None:
    with pytest.raises(KeyError, match="region"):
        render_text("{{ region }}", {"service": "chat"})


def test_text_without_templates_is_unchanged() -> None:
    assert render_text("{ not a template } {{ }}", {}) == "{ not a template } {{ }}"


def test_variables_in_finds_every_name_in_order() -> None:
    assert variables_in("{{a}} {{ b_1 }} {{  selector  }} {{ a }} {{ 1x }}") == ["a", "b_1", "selector", "a"]
