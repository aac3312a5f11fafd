"""The nesting guard in front of PyYAML, for the config file and demo scenarios."""

from __future__ import annotations

import sys

import pytest
import yaml

from dracpu.yamlguard import MAX_YAML_DEPTH, YamlTooDeep, check_nesting
from dracpu_sim.demo.scenario import ScenarioError, parse_scenario

TOO_DEEP = f"the document is nested too deeply (more than {MAX_YAML_DEPTH} levels)"


def test_flow_nesting_on_one_line_is_refused_before_pyyaml_scans_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def scanned(*args: object, **kwargs: object) -> None:
        raise AssertionError("PyYAML was given the document")

    monkeypatch.setattr(yaml, "parse", scanned)
    with pytest.raises(YamlTooDeep, match=r"more than 100 levels"):
        check_nesting("a: " + "[" * 5000 + "]" * 5000 + "\n")


def test_nesting_across_lines_is_refused_by_the_event_pass() -> None:
    # 60 open brackets per line is fine for the scanner; 120 levels in all is not.
    text = "a: " + "[" * 60 + "\n  " + "[" * 60 + "\n" + "]" * 120 + "\n"
    with pytest.raises(YamlTooDeep):
        check_nesting(text)


def test_block_nesting_is_refused() -> None:
    text = "".join("  " * i + "-\n" for i in range(MAX_YAML_DEPTH + 1))
    with pytest.raises(YamlTooDeep):
        check_nesting(text)


def test_documents_within_the_limit_pass_brackets_in_strings_included() -> None:
    check_nesting("a: " + "[" * 99 + "]" * 99 + "\n")  # the mapping makes 100
    check_nesting('a: "' + "[" * 90 + '"\nb: [' + "{c: 1}, " * 500 + "]\n")
    check_nesting("a: '" + "]" * 500 + "'  # [[[[\n")


def test_syntax_errors_are_yaml_errors() -> None:
    with pytest.raises(yaml.YAMLError):
        check_nesting("a: [1, 2\n")


@pytest.mark.parametrize("limit", [200, 20000])
def test_scenario_nested_too_deeply_is_a_scenario_error(limit: int) -> None:
    # Whatever the interpreter's recursion limit, the answer is the guard's.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        for text in (
            "[" * 3000 + "]" * 3000,
            "a:\n" + "".join("  " * i + "- \n" for i in range(400)),
        ):
            with pytest.raises(ScenarioError) as caught:
                parse_scenario(text, "s.yaml")
            assert str(caught.value) == f"s.yaml: {TOO_DEEP}"
    finally:
        sys.setrecursionlimit(old)


def test_quoted_brackets_in_flow_collections_are_text() -> None:
    # A quote right after [ { or , starts a quoted scalar: its ']' closes nothing.
    with pytest.raises(YamlTooDeep):
        check_nesting("[']', " * 200)
    with pytest.raises(YamlTooDeep):
        check_nesting('["]\\"]", ' * 200)
    with pytest.raises(YamlTooDeep):
        check_nesting("['it''s ]', " * 200)
    check_nesting("a: ['[[[[', \"{{{{\", 'x'']]]]', !t ']]', &a ']]']\n" * 50)


def test_quotes_after_tags_and_anchors_are_text_too() -> None:
    with pytest.raises(YamlTooDeep):
        check_nesting("[!t ']', " * 200)
    with pytest.raises(YamlTooDeep):
        check_nesting("[&a !!str ']', " * 200)


def test_quotes_after_a_value_colon_are_text_too() -> None:
    # The closers inside the values hide nothing: each line's 95 + 1 open brackets add up.
    with pytest.raises(YamlTooDeep):
        check_nesting(("[" * 95 + '{a: "' + "]" * 95 + '"}, ') * 6)
    with pytest.raises(YamlTooDeep):
        check_nesting(("[" * 95 + '{"a":"' + "]" * 95 + '"}, ') * 6)
    check_nesting('{"a":"]]]]", b: "[[[[", c: !t "{{{{"}\n')
