"""The dashboards' cluster variable and the filter that puts it on every PromQL selector.

A fleet is several clusters, each Prometheus pair with its own ``cluster`` external label (docs/fleet.md):
through Thanos Query every series carries it. Every dashboard has the variable ``$cluster`` (a
multi-select of ``label_values(up, cluster)`` with an "All" whose value is ``.*``) and every vector
selector of every query carries ``cluster=~"$cluster"``, as Grafana dashboards with a cluster variable
do. With All selected the matcher is ``.*``, which also matches a series with no ``cluster`` label (a
Prometheus read directly, whose external labels are not on its stored series): a single-cluster stack
shows the same numbers as without the variable.

The filter is applied to the queries' text by :func:`on_cluster` (dashboards/model.py ``q``), not typed by
hand in each of them: a small PromQL scanner that knows where a selector can be (it skips strings, range
brackets, label lists of ``by``/``on``/... and Grafana's ``$variables``). A test checks every selector of
the committed JSON independently of it (tests/dashboards/test_cluster_variable.py).
"""

from __future__ import annotations

import re

NAME = "cluster"
LABEL = "Cluster"
QUERY = "label_values(up, cluster)"  # `up` exists on every stack: every scrape target has one
ALL_VALUE = ".*"
MATCHER = 'cluster=~"$cluster"'
# The logs' field the pipelines give every document (pipelines/templates/fleetsight-logs.json, a keyword):
# a Lucene regular expression, so that All (``.*``) and a selection (``${cluster:regex}``: ``(a|b)``) both
# read as one.
LUCENE = "fleetsight.cluster:/${cluster:regex}/"

IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")  # 0.3, 1e3, and durations (5m) outside brackets
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "start", "end"})
# Aggregation operators: a name, then `by (...)`/`without (...)` or the parenthesised argument.
AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
})  # fmt: skip
# Followed by a parenthesised list of label names, not of expressions.
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


def closing(text: str, start: int, open_char: str, close_char: str) -> int:
    """The index just after the bracket that closes the one at ``start`` (strings inside skipped)."""
    depth, index = 0, start
    while index < len(text):
        char = text[index]
        if char in "\"'`":
            index = string_end(text, index)
            continue
        if char == open_char:
            depth += 1
        elif char == close_char:
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ValueError(f"unbalanced {open_char!r} in {text!r}")


def string_end(text: str, start: int) -> int:
    quote, index = text[start], start + 1
    while index < len(text):
        if text[index] == "\\" and quote != "`":
            index += 2
            continue
        if text[index] == quote:
            return index + 1
        index += 1
    raise ValueError(f"unterminated string in {text!r}")


def with_matcher(braces: str) -> str:
    """``{a="b"}`` -> ``{cluster=~"$cluster", a="b"}``; a selector that has it already is left alone."""
    inner = braces[1:-1].strip()
    if re.search(r"(^|[{,\s])cluster\s*(=|!=|=~|!~)", inner):
        return braces
    return "{" + MATCHER + (", " + inner if inner else "") + "}"


def on_cluster(expr: str) -> str:
    """``expr`` with ``cluster=~"$cluster"`` on each vector selector (a metric name, with or without
    braces, or bare braces); everything else as it was."""
    out: list[str] = []
    index = 0
    while index < len(expr):
        char = expr[index]
        if char in "\"'`":
            end = string_end(expr, index)
        elif char == "[":  # a range or a subquery's [range:step]: durations and $__variables only
            end = closing(expr, index, "[", "]")
        elif char == "{":
            end = closing(expr, index, "{", "}")
            out.append(with_matcher(expr[index:end]))
            index = end
            continue
        elif char == "$":  # a Grafana variable: $name or ${name...}
            match = re.compile(r"\$(\{[^}]*\}|\w+)").match(expr, index)
            end = match.end() if match else index + 1
        elif char.isdigit() or (char == "." and expr[index + 1 : index + 2].isdigit()):
            match = NUMBER.match(expr, index)
            end = match.end() if match else index + 1
        elif IDENTIFIER.match(expr, index):
            end = identifier(expr, index, out)
            index = end
            continue
        else:
            end = index + 1
        out.append(expr[index:end])
        index = end
    return "".join(out)


def identifier(expr: str, index: int, out: list[str]) -> int:
    """Appends the identifier at ``index`` (a metric name gets its matcher) and returns where it ends."""
    match = IDENTIFIER.match(expr, index)
    assert match is not None
    word, end = match.group(0), match.end()
    after = end
    while after < len(expr) and expr[after].isspace():
        after += 1
    following = expr[after : after + 1]
    if word in LABEL_LISTS and following == "(":
        list_end = closing(expr, after, "(", ")")
        out.append(expr[index:list_end])
        return list_end
    not_a_metric = word.lower() in KEYWORDS or word in LABEL_LISTS or word in AGGREGATIONS
    if not_a_metric or following == "(":  # a keyword, an operator or a function's name
        out.append(word)
        return end
    if following == "{":
        selector_end = closing(expr, after, "{", "}")
        out.append(word + expr[end:after] + with_matcher(expr[after:selector_end]))
        return selector_end
    out.append(word + "{" + MATCHER + "}")
    return end
