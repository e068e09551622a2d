"""RainerScript building blocks that every edge ruleset part uses: a field's path in the message tree,
JSON values rsyslog's ``set`` cannot make, the ECS event fields, and the copy of parsed fields into the
document. Its own module so that the time blocks and the classifiers (edge_times, edge_classify) and the
ruleset that assembles them (edge) share them without importing one another.
"""

from __future__ import annotations

import re

from ..catalogue import Rule
from .patterns import NEGATIVE, lognorm_name


def rs_path(name: str) -> str:
    return "$!" + name.replace(".", "!")


def copy_fields(rules: tuple[Rule, ...], source: str) -> list[str]:
    """Copy each field the rules parsed (under source: $!_env, $!_ev) to its place in the document, once
    per name; a float or a signed field through its own conversion."""
    lines = []
    seen: set[str] = set()
    # A field that keeps a literal prefix in one rule and not in another: that rule's value gets it after.
    prefixed = [
        (rule, field)
        for rule in rules
        for field in rule.fields()
        if field.prefix and any(f.name == field.name and not f.prefix for r in rules for f in r.fields())
    ]
    for rule in rules:
        for field in rule.fields():
            if field.name in seen or field.name.startswith("_tmp."):
                continue
            seen.add(field.name)
            src = f"{source}!{lognorm_name(field.name)}"
            value = f'"{field.prefix}" & {src}' if field.prefix and (rule, field) not in prefixed else src
            if field.type == "float":
                container = "$!_json_" + lognorm_name(field.name)
                lines += [
                    f"  if exists({src}) then {{",
                    f"    set $.ok = parse_json('{{\"v\": ' & {src} & '}}', '{container}');",
                    f"    set {rs_path(field.name)} = {container}!v;",
                    f"    unset {container};",
                    "  }",
                ]
                continue
            lines.append(f"  if exists({src}) then {{ set {rs_path(field.name)} = {value}; }}")
            if field.type == "sint":
                negative = src + NEGATIVE
                lines.append(
                    f"  if exists({negative}) then {{ set {rs_path(field.name)} = 0 - {negative}; }}"
                )
    for rule, field in prefixed:
        src = f"{source}!{lognorm_name(field.name)}"
        lines.append(
            f'  if $.rule == "{rule.id}" and exists({src}) then '
            f'{{ set {rs_path(field.name)} = "{field.prefix}" & {src}; }}'
        )
    return lines


def json_set(path: str, json_text: str) -> list[str]:
    """Set a JSON value rsyslog's `set` cannot make (a boolean, an array): parse into a container of its
    own (parse_json into a container used before misplaces the value), then copy."""
    container = "$!_json_" + re.sub(r"[^a-z]", "_", path.lower())
    return [
        f"    set $.ok = parse_json('{{\"v\": {json_text}}}', '{container}');",
        f"    set {path} = {container}!v;",
        f"    unset {container};",
    ]


def set_event(category: str, type_: str) -> list[str]:
    """event.category and event.type, one-element arrays, from RainerScript expressions."""
    return [
        f"    set $.ok = parse_json('{{\"v\": [\"' & {category} & '\"]}}', '$!_json_category');",
        "    set $!event!category = $!_json_category!v;",
        "    unset $!_json_category;",
        f"    set $.ok = parse_json('{{\"v\": [\"' & {type_} & '\"]}}', '$!_json_type');",
        "    set $!event!type = $!_json_type!v;",
        "    unset $!_json_type;",
    ]


def unparsed_unless(condition: str) -> list[str]:
    return [
        f"  if not ({condition}) then {{",
        '    set $!event!action = "unparsed";',
        *json_set("$!tags", '["parse_failure"]'),
        "  }",
    ]


def json_number(path: str, text: str) -> list[str]:
    """A number from its text, parsed by json-c (strtod), as Double.parseDouble in the pipeline."""
    container = "$!_json_" + re.sub(r"[^a-z]", "_", path.lower())
    return [
        f"    set $.ok = parse_json('{{\"v\": ' & {text} & '}}', '{container}');",
        f"    set {path} = {container}!v;",
        f"    unset {container};",
    ]
