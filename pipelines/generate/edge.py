"""The RainerScript ruleset that parses one log class on the node (``edge_ruleset``, written into the
node's rsyslog configuration by rsyslog_conf) and the Xid lookup tables it reads: the frame and body
parsed (mmnormalize rulebases or POSIX regexes), the line's time, the classify step, into the same ECS
document the ingest pipeline makes. The assembly only: times and classifiers have their own modules.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetsight import xid_catalog

from ..catalogue import ClassCatalogue, Rule
from .edge_classify import CLASSIFIERS
from .edge_times import TIME_BLOCKS
from .patterns import LOSS_ERE, ere_pattern, lognorm_name, lower_events, main_events
from .rainerscript import copy_fields, json_set


def _lognorm_parse(catalogue: ClassCatalogue, edge_dir: Path) -> list[str]:
    """mmnormalize the line's frame, then the body: fields under $!_env and $!_ev, rule ids in $.envelope
    and $.rule (from the rule's tag)."""
    name = catalogue.log_class
    lines = [
        f'  action(type="mmnormalize" ruleBase="{edge_dir / (name + "-envelope.rb")}" useRawMsg="on"'
        ' path="$!_env")',
        '  set $.envelope = re_extract($!_env!event.tags, \'"([^"]+)"\', 0, 1, "");',
        "  set $.body = $rawmsg;",
        '  if $.envelope != "" then { set $.body = $!_env!f__tmp_body; }',
        '  set $.rule = "";',
    ]
    if catalogue.events:
        lines += [
            f'  action(type="mmnormalize" ruleBase="{edge_dir / (name + "-events.rb")}" variable="$.body"'
            ' path="$!_ev")',
            '  set $.rule = re_extract($!_ev!event.tags, \'"([^"]+)"\', 0, 1, "");',
            *_loss_checks(main_events(catalogue)),
        ]
    if lower_events(catalogue):
        lines += [
            '  if $.rule == "" then {',
            "    unset $!_ev;",
            "    set $.lbody = tolower($.body);",
            f'    action(type="mmnormalize" ruleBase="{edge_dir / (name + "-events-lower.rb")}" '
            'variable="$.lbody" path="$!_ev")',
            '    set $.rule = re_extract($!_ev!event.tags, \'"([^"]+)"\', 0, 1, "");',
            *["  " + line for line in _loss_checks(lower_events(catalogue))],
            "  }",
        ]
    return lines


def _loss_checks(rules: tuple[Rule, ...]) -> list[str]:
    """A loss field takes what char-sep took only when it is a loss (the grok type says so itself): a rule
    whose every pattern has the field then did not match; one where only some have it, matched without."""
    lines = []
    for rule in rules:
        for field in rule.fields():
            if field.type != "loss":
                continue
            value = f"$!_ev!{lognorm_name(field.name)}"
            everywhere = all(f"{{{field.name}:loss}}" in pattern for pattern in rule.patterns)
            fail = '{ set $.rule = ""; unset $!_ev; }' if everywhere else f"{{ unset {value}; }}"
            lines.append(
                f"  if $.rule == \"{rule.id}\" and exists({value}) and not re_match({value}, '{LOSS_ERE}') "
                f"then {fail}"
            )
    return lines


def _regex_parse(catalogue: ClassCatalogue) -> list[str]:
    """The envelope patterns as POSIX regexes, tried in order (the first that matches wins, as in grok);
    each field is its submatch, under $!_env as mmnormalize would put it."""
    lines = ['  set $.envelope = "";', "  set $.body = $rawmsg;", '  set $.rule = "";']
    keyword = "if"
    for rule in catalogue.envelopes:
        for pattern in rule.patterns:
            regex, groups = ere_pattern(pattern)
            lines.append(f"  {keyword} re_match($rawmsg, '{regex}') then {{")
            lines.append(f'    set $.envelope = "{rule.id}";')
            lines += [
                f"    set $!_env!{lognorm_name(name)} = re_extract($rawmsg, '{regex}', 0, {group}, \"\");"
                for name, group in groups.items()
            ]
            lines.append("  }")
            keyword = "else if"
    return lines


def edge_ruleset(catalogue: ClassCatalogue, edge_dir: Path, time_template: str) -> str:
    """The RainerScript of one class's ruleset on the node: the line in $rawmsg, node and cluster in $.node
    and $.cluster; leaves the ECS document in $! (the record's template is %$!%)."""
    name = catalogue.log_class
    lines = [
        f"  set $.created = exec_template({json.dumps(time_template)});",
        "  set $.fileoffset = $!metadata!fileoffset;",
        "  set $.filename = $!metadata!filename;",
        "  unset $!metadata;",
        *(
            _regex_parse(catalogue)
            if catalogue.edge_engine == "regex"
            else _lognorm_parse(catalogue, edge_dir)
        ),
        "  set $!message = $rawmsg;",
        "  set $!@timestamp = $.created;",
        "  set $!host!name = $.node;",
        "  set $!log!file!path = $.filename;",
        "  set $!log!offset = cnum($.fileoffset);",
        '  set $!event!id = $.node & ":" & $.filename & ":" & $.fileoffset;',
        "  set $!event!created = $.created;",
        '  set $!event!kind = "event";',
        '  set $!event!module = "fleetsight";',
        f'  set $!event!dataset = "fleetsight.{name}";',
        "  set $!fleetsight!cluster = $.cluster;",
        f'  set $!fleetsight!log_class = "{name}";',
        # The line's own time: RFC 3339 (kept to the millisecond, in UTC), BSD syslog (this year), or
        # dmesg -T's ctime; a time that does not exist (Feb 30) is tagged and the read time stays.
        '  set $.ts = ""; set $.tsbad = "";',
        *TIME_BLOCKS[name](),
        '  if $.ts != "" then { set $!@timestamp = $.ts; }',
        '  if $.tsbad != "" then {',
        *json_set("$!tags", '["timestamp_unparsed"]'),
        "  }",
        *copy_fields(tuple(r for r in catalogue.envelopes), "$!_env"),
        *(copy_fields(catalogue.events, "$!_ev") if name != "application" else []),
        *CLASSIFIERS[name](catalogue),
        "  unset $!_env;",
        "  unset $!_ev;",
    ]
    return "\n".join(lines)


def lookup_tables(edge_dir: Path) -> str:
    """rsyslog lookup_table() declarations of the Xid catalogue (category, action)."""
    return "\n".join(
        f'lookup_table(name="xid_{what}" file="{edge_dir / f"xid_{what}.json"}" reloadOnHUP="on")'
        for what in ("category", "action")
    )


def xid_table(what: str) -> str:
    unknown = getattr(xid_catalog.UNKNOWN, what)
    table = [
        {"index": str(code), "value": getattr(info, what)}
        for code, info in sorted(xid_catalog.CATALOG.items())
    ]
    return json.dumps({"version": 1, "nomatch": unknown, "type": "string", "table": table}, indent=1) + "\n"
