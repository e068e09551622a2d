"""One catalogue pattern in each engine's syntax: grok for the ingest pipeline, liblognorm rulebases and
POSIX extended regexes for the edge. Its own module because the pattern language changes here, and only
here, whenever the catalogue gains a field type; the documents built around the matches do not.
"""

from __future__ import annotations

import json
import re

from ..catalogue import NUMERIC, ClassCatalogue, Field, Rule, tokens

LOSS = (
    "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
    "|[-+]?(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
)
# The same as a POSIX ERE (the edge checks the value char-sep took with it).
LOSS_ERE = (
    "^(-?(0|[1-9][0-9]*)([.][0-9]+)?([eE][-+]?[0-9]+)?"
    "|[-+]?([nN][aA][nN]|[iI][nN][fF]([iI][nN][iI][tT][yY])?))$"
)
LOSS_SEPARATORS = " ,;|"
GROK_TYPES = {
    "int": "[0-9]+",
    "long": "[0-9]+",
    "sint": "-?[0-9]+",
    "float": "-?[0-9]+(?:\\.[0-9]*)?",
    "word": "[^ ]+",
    "alpha": "[A-Za-z]+",
    "ws": "\\s+",
    "rest": ".*",
    "rfc5424": "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]{1,6})?"
    "(?:Z|[+-][0-9]{2}:[0-9]{2})",
    "rfc3164": "[A-Z][a-z]{2} {1,2}[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2}",
    "ipv4": "(?:{octet})(?:\\.(?:{octet})){{3}}".format(octet="25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]"),
    "ipv6": "%{IPV6}",
    "date": "[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])",
    "time": "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]",
    # A loss: a number or nan/inf, then a separator or the end (liblognorm's char-sep ends there too).
    "loss": "(?:" + LOSS + ")(?![^ ,;|])",
    # A column: neither starts nor ends with a space, holds no '|' (the spaces around it are outside).
    "cell": "[^| ](?:[^|]*[^| ])?",
    "tail": "[^ ](?:.*[^ ])?",
}
# POSIX extended regexes of the column types (RainerScript re_match/re_extract): the same sets as above.
ERE_TYPES = {
    "int": "[0-9]+",
    "word": "[^ ]+",
    "cell": " *([^| ]([^|]*[^| ])?) *",
    "tail": " *([^ ](.*[^ ])?) *$",
}
LOGNORM_TYPES = {
    "int": {"type": "number", "format": "number"},
    "long": {"type": "number", "format": "number"},
    # As text: liblognorm's own conversion can miss the nearest double by one ulp; the edge ruleset
    # parses the text with json-c (strtod), as Java's Double.parseDouble does in the pipeline.
    "float": {"type": "float"},
    "word": {"type": "word"},
    "alpha": {"type": "alpha"},
    "ws": {"type": "whitespace"},
    "rest": {"type": "rest"},
    "rfc5424": {"type": "date-rfc5424"},
    "rfc3164": {"type": "date-rfc3164"},
    "ipv4": {"type": "ipv4"},
    "ipv6": {"type": "ipv6"},
    "date": {"type": "date-iso"},
    "time": {"type": "time-24hr"},
    "loss": {"type": "char-sep", "extradata": LOSS_SEPARATORS},
}
NEGATIVE = "__neg"  # lognorm's number takes no sign: a sint field has a '-' variant under this suffix

# -- grok (ingest pipeline) ------------------------------------------------------------------------


def _definition_name(field: Field) -> str:
    """A grok pattern name per distinct field type (grok names allow [A-Za-z0-9_] only)."""
    key = f"{field.type}_{field.arg}_{field.prefix}"
    if not field.arg and not field.prefix:
        return f"FS_{field.type.upper()}"
    return "FS_" + field.type.upper() + "_" + "".join(f"{ord(c):x}" for c in key[len(field.type) + 1 :])


def _field_regex(field: Field) -> str:
    if field.type == "to":
        body = "[^" + re.escape(field.arg) + "]+"
    elif field.type == "until":
        # Atomic: the first occurrence only, as liblognorm's string-to (no backtracking to a later one).
        body = "(?>.+?(?=" + re.escape(field.arg) + "))"
    else:
        body = GROK_TYPES[field.type]
    return re.escape(field.prefix) + body


def grok_pattern(pattern: str, rule_id: str, definitions: dict[str, str]) -> str:
    """One catalogue pattern as a grok pattern that also names its rule (an empty capture)."""
    out = ["^(?<_tmp.rule." + rule_id + ">)"]
    for token in tokens(pattern):
        if isinstance(token, str):
            out.append(re.escape(token).replace("\\ ", " "))
            continue
        name = _definition_name(token)
        definitions[name] = _field_regex(token)
        if token.name == "-":
            field = "%{" + name + "}"
        else:
            suffix = ":" + NUMERIC[token.type] if token.type in NUMERIC else ""
            field = "%{" + name + ":" + token.name + suffix + "}"
        # A column's spaces around its text are not part of it.
        out.append({"cell": " *{} *", "tail": " *{} *$"}.get(token.type, "{}").format(field))
    return "".join(out)


def grok_patterns(rules: tuple[Rule, ...]) -> tuple[list[str], dict[str, str]]:
    definitions: dict[str, str] = {}
    patterns = [grok_pattern(p, rule.id, definitions) for rule in rules for p in rule.patterns]
    return patterns, dict(sorted(definitions.items()))


# -- liblognorm (edge) -----------------------------------------------------------------------------


def lognorm_name(name: str) -> str:
    return "-" if name == "-" else "f_" + re.sub(r"[^A-Za-z0-9]", "_", name)


def _lognorm_literal(text: str) -> str:
    return text.replace("%", "%%")


def _lognorm_variants(pattern: str) -> list[str]:
    """The rule bodies of one pattern (a signed field gives a second variant with a literal '-')."""
    variants = [""]
    for token in tokens(pattern):
        if isinstance(token, str):
            variants = [v + _lognorm_literal(token) for v in variants]
            continue
        name = lognorm_name(token.name)
        literal = _lognorm_literal(token.prefix)
        if token.type == "sint":
            spec = {"name": name, **LOGNORM_TYPES["int"]}
            negative = {"name": name + NEGATIVE, **LOGNORM_TYPES["int"]}
            variants = [v + literal + p for v in variants for p in ("%" + json.dumps(spec) + "%",)] + [
                v + literal + "-%" + json.dumps(negative) + "%" for v in variants
            ]
            continue
        if token.type == "to":
            spec = {"name": name, "type": "char-to", "extradata": token.arg}
        elif token.type == "until":
            spec = {"name": name, "type": "string-to", "extradata": token.arg}
        else:
            spec = {"name": name, **LOGNORM_TYPES[token.type]}
        variants = [v + literal + "%" + json.dumps(spec) + "%" for v in variants]
    last = tokens(pattern)[-1]
    if not (isinstance(last, Field) and last.type == "rest"):
        variants = [v + '%{"name":"-","type":"rest"}%' for v in variants]
    return variants


def lognorm_rulebase(rules: tuple[Rule, ...], what: str) -> str:
    lines = [
        "version=2",
        f"# FleetSight {what}: generated from pipelines/catalogue.py by `fleetsight logs generate`.",
    ]
    for rule in rules:
        for pattern in rule.patterns:
            lines += [f"rule={rule.id}:{body}" for body in _lognorm_variants(pattern)]
    return "\n".join(lines) + "\n"


# -- POSIX regexes (edge, classes of columns) -------------------------------------------------------


def ere_literal(text: str) -> str:
    if any(c in text for c in "^\\'[]"):
        raise ValueError(f"no ERE literal for {text!r}")
    return "".join(f"[{c}]" if c in ".*+?(){}|$" else c for c in text)


def ere_pattern(pattern: str) -> tuple[str, dict[str, int]]:
    """One catalogue pattern as an anchored POSIX ERE, and the submatch number of each field."""
    out, groups, count = ["^"], {}, 0
    for token in tokens(pattern):
        if isinstance(token, str):
            out.append(ere_literal(token))
            continue
        regex = ERE_TYPES[token.type]
        if "(" not in regex:
            regex = f"({regex})"
        groups[token.name] = count + 1
        count += regex.count("(")
        out.append(regex)
    return "".join(out), groups


# -- which rules go through which pass ---------------------------------------------------------------
# The case-insensitive rules (rule.lower) match in a second pass over the lower-cased text, in both engines.


def main_events(catalogue: ClassCatalogue) -> tuple[Rule, ...]:
    return tuple(rule for rule in catalogue.events if not rule.lower)


def lower_events(catalogue: ClassCatalogue) -> tuple[Rule, ...]:
    return tuple(rule for rule in catalogue.events if rule.lower)
