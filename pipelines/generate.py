"""Both parsers of a catalogued log class, generated from ``pipelines/catalogue.py``.

- **Ingest pipeline** (``pipelines/ingest/<class>.json``): the envelope and events grok processors, the
  date processors and the classify script's parameters are rewritten in place (found by their tags); the
  hand-written painless around them (the envelope script's fast path) stays.
- **Edge** (``pipelines/edge/``): the liblognorm rulebases ``<class>-envelope.rb`` and
  ``<class>-events.rb`` (rsyslog ``mmnormalize``), the Xid lookup tables, and the RainerScript ruleset
  (``edge_ruleset``) that turns their result into the same ECS document the ingest pipeline makes.

``fleetsight logs generate`` writes them; ``--check`` (CI) fails when a file differs from the catalogue.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fleetsight import xid_catalog

from .catalogue import (
    CATALOGUES,
    NUMERIC,
    SEL_ERROR_WORDS,
    SEL_INFO_WORDS,
    SEL_SENSOR_TYPES,
    ClassCatalogue,
    Field,
    Rule,
    tokens,
)

PIPELINES_DIR = Path(__file__).resolve().parent
INGEST_DIR = PIPELINES_DIR / "ingest"
EDGE_DIR = PIPELINES_DIR / "edge"

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
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
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


def _ere_literal(text: str) -> str:
    if any(c in text for c in "^\\'[]"):
        raise ValueError(f"no ERE literal for {text!r}")
    return "".join(f"[{c}]" if c in ".*+?(){}|$" else c for c in text)


def ere_pattern(pattern: str) -> tuple[str, dict[str, int]]:
    """One catalogue pattern as an anchored POSIX ERE, and the submatch number of each field."""
    out, groups, count = ["^"], {}, 0
    for token in tokens(pattern):
        if isinstance(token, str):
            out.append(_ere_literal(token))
            continue
        regex = ERE_TYPES[token.type]
        if "(" not in regex:
            regex = f"({regex})"
        groups[token.name] = count + 1
        count += regex.count("(")
        out.append(regex)
    return "".join(out), groups


# -- classify (both engines) -----------------------------------------------------------------------


def rule_params(catalogue: ClassCatalogue) -> dict[str, Any]:
    return {
        rule.id: {
            "action": rule.action,
            "level": rule.level,
            "category": rule.category,
            "derive": rule.derive,
        }
        for rule in catalogue.events
    }


def xid_params() -> dict[str, Any]:
    return {
        "xid_catalog": {
            str(code): {"category": info.category, "action": info.action}
            for code, info in sorted(xid_catalog.CATALOG.items())
        },
        "xid_unknown": {"category": xid_catalog.UNKNOWN.category, "action": xid_catalog.UNKNOWN.action},
    }


CLASSIFY_SOURCE = """\
def body = ctx._tmp.body;
String rule = null;
if (ctx._tmp.rule != null) { for (def key : ctx._tmp.rule.keySet()) { rule = key; } }
String action = null; String level = null; String category = null;
if (rule != null) {
  def r = params.rules[rule];
  action = r.action; level = r.level; category = r.category;
  if (r.derive == 'sxid_fatal') {
    boolean fatal = ctx.nvidia.sxid.message.startsWith('Fatal');
    ctx.nvidia.sxid.fatal = fatal;
    if (fatal) { action = 'nvswitch_fatal'; level = 'critical'; }
  } else if (r.derive == 'ib_state') {
    String state = ctx.ib.state.toLowerCase();
    ctx.ib.state = state;
    if (state == 'down') { action = 'ib_link_down'; level = 'error'; }
    else if (state == 'up') { action = 'ib_link_up'; level = 'info'; }
    else { action = 'ib_port_state'; level = state == 'active' ? 'info' : 'warning'; }
  } else if (r.derive == 'fallen_off_bus' && body.contains('fallen off the bus')) {
    action = 'gpu_fallen_off_bus'; level = 'critical';
  }
  def nv = ctx.nvidia;
  if (nv != null && nv.xid != null && nv.xid.code != null) {
    def info = params.xid_catalog[String.valueOf(nv.xid.code)];
    nv.xid.category = info == null ? params.xid_unknown.category : info.category;
    nv.xid.action = info == null ? params.xid_unknown.action : info.action;
  }
}
if (action != null) {
  ctx._tmp.matched = true;
  ctx.event.action = action;
  if (ctx.log == null) { ctx.log = [:]; }
  ctx.log.level = level;
  ctx.event.category = [category];
  ctx.event.type = [level == 'info' ? 'info' : 'error'];
} else {
  ctx.event.action = params.default_action;
}
if (!ctx._tmp.envelope && !ctx._tmp.matched) {
  if (ctx.tags == null) { ctx.tags = []; }
  ctx.tags.add('parse_failure');
  ctx.event.action = 'unparsed';
}
if (ctx.log == null) { ctx.log = [:]; }
if (ctx.log.level == null) { ctx.log.level = 'info'; }
if (ctx._tmp.day != null) {
  ctx._index = params.index_prefix + ctx._tmp.day;
  ctx.remove('_tmp');
}"""


# -- the ingest pipeline, rewritten in place -------------------------------------------------------


def _by_tag(processors: list[dict[str, Any]], kind: str, tag: str) -> dict[str, Any]:
    for processor in processors:
        body = processor.get(kind)
        if body is not None and body.get("tag") == tag:
            return body
    raise ValueError(f"no {kind} processor tagged {tag!r}")


def _ensure(processors: list[dict[str, Any]], after: str, kind: str, body: dict[str, Any]) -> None:
    """Insert (or replace) the processor tagged body['tag'] right after the one tagged `after`."""
    for index, processor in enumerate(processors):
        if next(iter(processor.values())).get("tag") == body["tag"]:
            processors[index] = {kind: body}
            return
    for index, processor in enumerate(processors):
        if next(iter(processor.values())).get("tag") == after:
            processors.insert(index + 1, {kind: body})
            return
    raise ValueError(f"no processor tagged {after!r}")


def _kernel_times(catalogue: ClassCatalogue, processors: list[dict[str, Any]]) -> None:
    line_time = _by_tag(processors, "date", "line_time")
    line_time["formats"] = list(catalogue.time_formats["rfc5424"] + catalogue.time_formats["rfc3164"])
    _ensure(
        processors,
        "line_time",
        "date",
        {
            "tag": "ctime",
            "description": "dmesg -T time prefix ('[Fri Aug 30 11:43:09 2024] ...'), taken as UTC",
            "if": "ctx._tmp.fast == null && ctx._tmp.ctime != null",
            "field": "_tmp.ctime",
            "target_field": "@timestamp",
            "formats": list(catalogue.time_formats["ctime"]),
            "timezone": "UTC",
            "on_failure": [{"append": {"field": "tags", "value": ["timestamp_unparsed"]}}],
        },
    )


FM_CLASSIFY_SOURCE = """\
String level = ctx._tmp.level == null ? 'info' : ctx._tmp.level.toLowerCase();
if (level == 'warn') { level = 'warning'; }
if (ctx.log == null) { ctx.log = [:]; }
ctx.log.level = level;
String rule = null;
if (ctx._tmp.rule != null) { for (def key : ctx._tmp.rule.keySet()) { rule = key; } }
def r = rule == null ? null : params.rules[rule];
if (r != null && r.action != '') {
  ctx.nvidia.sxid.fatal = r.action == 'nvswitch_fatal';
  ctx.nvidia.sxid.message = ctx._tmp.body;
  ctx.event.action = r.action;
  ctx.log.level = r.level;
  ctx.event.category = [r.category];
  ctx.event.type = ['error'];
  ctx._tmp.matched = true;
} else if (level == 'error' || level == 'fatal' || level == 'critical') {
  ctx.event.action = 'fm_error';
  ctx.event.category = ['host'];
  ctx.event.type = ['error'];
} else {
  ctx.event.action = 'fm_message';
}"""


AUDIT_CLASSIFY_SOURCE = """\
String rule = null;
if (ctx._tmp.rule != null) { for (def key : ctx._tmp.rule.keySet()) { rule = key; } }
def r = rule == null ? null : params.rules[rule];
if (r != null && r.action != '') {
  ctx._tmp.matched = true;
  ctx.event.action = r.action;
  if (r.derive != '') { ctx.event.outcome = r.derive; }
  ctx.event.category = [r.category];
  ctx.event.type = ['start'];
  if (r.level != '') {
    if (ctx.log == null) { ctx.log = [:]; }
    ctx.log.level = r.level;
  }
}"""

BMC_CLASSIFY_SOURCE = """\
if (ctx.bmc != null && ctx.bmc.sel != null && ctx.bmc.sel.event != null) {
  ctx._tmp.matched = true;
  String e = ctx.bmc.sel.event.toLowerCase();
  boolean error = false; boolean info = false;
  for (def word : params.error_words) { if (e.contains(word)) { error = true; } }
  for (def word : params.info_words) { if (e.contains(word)) { info = true; } }
  String level = 'warning';
  if (ctx.bmc.sel.direction == 'Deasserted') { level = 'info'; }
  else if (error) { level = 'error'; }
  else if (info) { level = 'info'; }
  ctx.event.action = 'bmc_sel';
  if (ctx.log == null) { ctx.log = [:]; }
  ctx.log.level = level;
  ctx.event.category = ['host'];
  ctx.event.type = [level == 'info' ? 'info' : 'error'];
}"""


def _bmc_sensor(grok: dict[str, Any]) -> None:
    """The sensor column: its IPMI sensor type, then the sensor's name (else all of it is the type)."""
    grok["patterns"] = [
        "^%{SEL_TYPE:bmc.sel.sensor_type} %{GREEDYDATA:bmc.sel.sensor}$",
        "^%{GREEDYDATA:bmc.sel.sensor_type}$",
    ]
    grok["pattern_definitions"] = {
        "SEL_TYPE": "(?:" + "|".join(re.escape(t).replace("\\ ", " ") for t in SEL_SENSOR_TYPES) + ")"
    }


def main_events(catalogue: ClassCatalogue) -> tuple[Rule, ...]:
    return tuple(rule for rule in catalogue.events if not rule.lower)


def lower_events(catalogue: ClassCatalogue) -> tuple[Rule, ...]:
    return tuple(rule for rule in catalogue.events if rule.lower)


def _lower_events(catalogue: ClassCatalogue, processors: list[dict[str, Any]]) -> None:
    """The case-insensitive rules: when no other rule matched, the lower-cased text through their grok."""
    _ensure(
        processors,
        "events",
        "script",
        {
            "tag": "lower",
            "description": "The text in lower case for the case-insensitive rules (no other rule matched)",
            "if": "ctx._tmp.rule == null && ctx._tmp.body != null",
            "source": "ctx._tmp.lbody = ctx._tmp.body.toLowerCase();",
        },
    )
    patterns, definitions = grok_patterns(lower_events(catalogue))
    _ensure(
        processors,
        "lower",
        "grok",
        {
            "tag": "events_lower",
            "field": "_tmp.lbody",
            "patterns": patterns,
            "pattern_definitions": definitions,
            "ignore_missing": True,
            "ignore_failure": True,
        },
    )


def with_ingest_time(pipeline: dict[str, Any]) -> dict[str, Any]:
    """A document without @timestamp (a source that sends none) falls back to the ingest time, rather
    than failing the pipeline (every class's pipeline gets this processor first)."""
    processors = pipeline["processors"]
    if not any(next(iter(p.values())).get("tag") == "ingest_time" for p in processors):
        processors.insert(
            0,
            {
                "set": {
                    "tag": "ingest_time",
                    "description": "A document that arrives without @timestamp takes the ingest time",
                    "if": "ctx['@timestamp'] == null",
                    "field": "@timestamp",
                    "value": "{{_ingest.timestamp}}",
                }
            },
        )
    return pipeline


def ingest_pipeline(catalogue: ClassCatalogue, pipeline: dict[str, Any]) -> dict[str, Any]:
    processors = with_ingest_time(pipeline)["processors"]
    envelope = _by_tag(processors, "grok", "envelope")
    patterns, definitions = grok_patterns(catalogue.envelopes)
    envelope["patterns"] = [p.replace("^(?<_tmp.rule.", "^(?<_tmp.envelope_rule.") for p in patterns]
    envelope["pattern_definitions"] = definitions
    if catalogue.events:
        events = _by_tag(processors, "grok", "events")
        events["field"] = "_tmp.body"
        events["patterns"], events["pattern_definitions"] = grok_patterns(main_events(catalogue))
    if lower_events(catalogue):
        _lower_events(catalogue, processors)
    if catalogue.log_class == "application":
        _ensure(
            processors,
            "envelope_ok",
            "set",
            {
                "tag": "line_time_text",
                "if": "ctx._tmp.fast == null && ctx._tmp.date != null",
                "field": "_tmp.ts",
                "value": "{{{_tmp.date}}} {{{_tmp.time}}}",
            },
        )
        _by_tag(processors, "date", "line_time")["formats"] = list(catalogue.time_formats["line"])
    elif catalogue.log_class in {"audit", "bmc"}:
        _by_tag(processors, "date", "line_time")["formats"] = [
            f for formats in catalogue.time_formats.values() for f in formats
        ]
        classify = _by_tag(processors, "script", catalogue.classify_tag)
        if catalogue.log_class == "audit":
            classify.update(source=AUDIT_CLASSIFY_SOURCE, params={"rules": rule_params(catalogue)})
        else:
            _bmc_sensor(_by_tag(processors, "grok", "sensor"))
            classify.update(
                source=BMC_CLASSIFY_SOURCE,
                params={"error_words": list(SEL_ERROR_WORDS), "info_words": list(SEL_INFO_WORDS)},
            )
    elif catalogue.log_class == "kernel":
        _kernel_times(catalogue, processors)
        pipeline["processors"] = [
            p for p in processors if not ("convert" in p and p["convert"].get("field") == "_tmp.uptime")
        ]
        classify = _by_tag(pipeline["processors"], "script", catalogue.classify_tag)
        classify["source"] = CLASSIFY_SOURCE
        classify["params"] = {
            "rules": rule_params(catalogue),
            **xid_params(),
            "default_action": catalogue.default_action,
            "index_prefix": classify["params"]["index_prefix"],
        }
    else:
        line_time = _by_tag(processors, "date", "line_time")
        line_time.update(
            {
                "field": "_tmp.fmtime",
                "if": "ctx._tmp?.fmtime != null",
                "formats": list(catalogue.time_formats["fmtime"]),
            }
        )
        classify = _by_tag(processors, "script", catalogue.classify_tag)
        classify["source"] = FM_CLASSIFY_SOURCE
        classify["params"] = {"rules": rule_params(catalogue)}
    return pipeline


# -- the edge ruleset (RainerScript) ---------------------------------------------------------------


def _rs_path(name: str) -> str:
    return "$!" + name.replace(".", "!")


def _copy_fields(rules: tuple[Rule, ...], source: str) -> list[str]:
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
                    f"    set {_rs_path(field.name)} = {container}!v;",
                    f"    unset {container};",
                    "  }",
                ]
                continue
            lines.append(f"  if exists({src}) then {{ set {_rs_path(field.name)} = {value}; }}")
            if field.type == "sint":
                negative = src + NEGATIVE
                lines.append(
                    f"  if exists({negative}) then {{ set {_rs_path(field.name)} = 0 - {negative}; }}"
                )
    for rule, field in prefixed:
        src = f"{source}!{lognorm_name(field.name)}"
        lines.append(
            f'  if $.rule == "{rule.id}" and exists({src}) then '
            f'{{ set {_rs_path(field.name)} = "{field.prefix}" & {src}; }}'
        )
    return lines


def _json_set(path: str, json_text: str) -> list[str]:
    """Set a JSON value rsyslog's `set` cannot make (a boolean, an array): parse into a container of its
    own (parse_json into a container used before misplaces the value), then copy."""
    container = "$!_json_" + re.sub(r"[^a-z]", "_", path.lower())
    return [
        f"    set $.ok = parse_json('{{\"v\": {json_text}}}', '{container}');",
        f"    set {path} = {container}!v;",
        f"    unset {container};",
    ]


def _kernel_time_blocks() -> list[str]:
    """RFC 3339 (kept to the millisecond, in UTC), BSD syslog (this year), or dmesg -T's ctime."""
    return [
        "  if exists($!_env!f__tmp_ts) then {",
        "    set $.raw = $!_env!f__tmp_ts;",
        "    if re_match($.raw, '^[0-9]{4}-') then {",
        "      set $.day = substring($.raw, 0, 10);",
        '      set $.ms = substring(re_extract($.raw, \'T[0-9:]+[.]([0-9]+)\', 0, 1, "") & "000", 0, 3);',
        "      set $.unix = parse_time($.raw);",
        "    } else {",
        # BSD time, no year: this year. A day past the month's end (Feb 30) is the month's last day, as
        # the pipeline's date processor resolves it; parse_time rolls it into the next month instead.
        '      set $.unix = parse_time($.raw); set $.ms = "000";',
        '      set $.mon = substring($.raw, 0, 3); set $.mm = "";',
        *[
            f'      if $.mon == "{month}" then {{ set $.mm = "{number:02d}"; }}'
            for number, month in enumerate(MONTHS, start=1)
        ],
        '      set $.iso = format_time($.unix, "date-rfc3339");',
        "      if $.unix != 0 and substring($.iso, 5, 2) != $.mm then {",
        "        set $.unix = $.unix - cnum(substring($.iso, 8, 2)) * 86400;",
        "      }",
        '      set $.day = substring(format_time($.unix, "date-rfc3339"), 0, 10);',
        "    }",
        '    if $.unix == 0 or format_time(parse_time($.day & "T00:00:00Z"), "date-rfc3339") '
        '!= $.day & "T00:00:00Z" then { set $.tsbad = "1"; }',
        '    else { set $.ts = substring(format_time($.unix, "date-rfc3339"), 0, 19) & "." & $.ms & "Z"; }',
        "  }",
        "  if exists($!_env!f__tmp_ctime) then {",
        "    set $.parts = re_extract($!_env!f__tmp_ctime, "
        "'^([A-Z][a-z]{2}) {1,2}([0-9]{1,2}) ([0-9]{2}:[0-9]{2}:[0-9]{2}) ([0-9]{4})$', 0, 0, \"\");",
        '    set $.mon = substring($.parts, 0, 3); set $.mm = "";',
        *[
            f'    if $.mon == "{month}" then {{ set $.mm = "{number:02d}"; }}'
            for number, month in enumerate(MONTHS, start=1)
        ],
        "    set $.dd = re_extract($.parts, '^[A-Za-z]{3} {1,2}([0-9]{1,2}) ', 0, 1, \"\");",
        '    if strlen($.dd) == 1 then { set $.dd = "0" & $.dd; }',
        '    set $.day = re_extract($.parts, \'([0-9]{4})$\', 0, 1, "") & "-" & $.mm & "-" & $.dd;',
        "    set $.hms = re_extract($.parts, ' ([0-9]{2}:[0-9]{2}:[0-9]{2}) ', 0, 1, \"\");",
        '    if $.parts == "" or $.mm == "" or format_time(parse_time($.day & "T00:00:00Z"), "date-rfc3339") '
        '!= $.day & "T00:00:00Z" or format_time(parse_time($.day & "T" & $.hms & "Z"), "date-rfc3339") '
        '!= $.day & "T" & $.hms & "Z" then { set $.tsbad = "1"; }',
        '    else { set $.ts = $.day & "T" & $.hms & ".000Z"; }',
        "  }",
    ]


def _fm_time_block() -> list[str]:
    """Fabric Manager's '[Mar 07 2024 11:52:28]' (taken as UTC, as the pipeline's date processor does)."""
    return [
        "  if exists($!_env!f__tmp_fmtime) then {",
        "    set $.parts = re_extract($!_env!f__tmp_fmtime, "
        "'^([A-Z][a-z]{2}) ([0-9]{1,2}) ([0-9]{4}) ([0-9]{2}:[0-9]{2}:[0-9]{2})$', 0, 0, \"\");",
        '    set $.mon = substring($.parts, 0, 3); set $.mm = "";',
        *[
            f'    if $.mon == "{month}" then {{ set $.mm = "{number:02d}"; }}'
            for number, month in enumerate(MONTHS, start=1)
        ],
        "    set $.dd = re_extract($.parts, '^[A-Za-z]{3} ([0-9]{1,2}) ', 0, 1, \"\");",
        '    if strlen($.dd) == 1 then { set $.dd = "0" & $.dd; }',
        '    set $.day = re_extract($.parts, \' ([0-9]{4}) \', 0, 1, "") & "-" & $.mm & "-" & $.dd;',
        "    set $.hms = re_extract($.parts, '([0-9]{2}:[0-9]{2}:[0-9]{2})$', 0, 1, \"\");",
        '    if $.parts == "" or $.mm == "" or format_time(parse_time($.day & "T00:00:00Z"), "date-rfc3339") '
        '!= $.day & "T00:00:00Z" or format_time(parse_time($.day & "T" & $.hms & "Z"), "date-rfc3339") '
        '!= $.day & "T" & $.hms & "Z" then { set $.tsbad = "1"; }',
        '    else { set $.ts = $.day & "T" & $.hms & ".000Z"; }',
        "  }",
    ]


def _set_event(category: str, type_: str) -> list[str]:
    """event.category and event.type, one-element arrays, from RainerScript expressions."""
    return [
        f"    set $.ok = parse_json('{{\"v\": [\"' & {category} & '\"]}}', '$!_json_category');",
        "    set $!event!category = $!_json_category!v;",
        "    unset $!_json_category;",
        f"    set $.ok = parse_json('{{\"v\": [\"' & {type_} & '\"]}}', '$!_json_type');",
        "    set $!event!type = $!_json_type!v;",
        "    unset $!_json_type;",
    ]


def _unparsed_unless(condition: str) -> list[str]:
    return [
        f"  if not ({condition}) then {{",
        '    set $!event!action = "unparsed";',
        *_json_set("$!tags", '["parse_failure"]'),
        "  }",
    ]


def _kernel_classify(catalogue: ClassCatalogue) -> list[str]:
    lines = ['  set $.action = ""; set $.level = ""; set $.category = "";']
    for rule in catalogue.events:
        lines.append(
            f'  if $.rule == "{rule.id}" then {{ set $.action = "{rule.action}"; '
            f'set $.level = "{rule.level}"; set $.category = "{rule.category}"; }}'
        )
    return [
        *lines,
        '  if $.rule == "sxid" then {',
        "    if re_match($!nvidia!sxid!message, '^Fatal') then {",
        '      set $.action = "nvswitch_fatal"; set $.level = "critical";',
        *["  " + line for line in _json_set("$!nvidia!sxid!fatal", "true")],
        "    } else {",
        *["  " + line for line in _json_set("$!nvidia!sxid!fatal", "false")],
        "    }",
        "  }",
        '  if $.rule startswith "ib_" then {',
        "    set $!ib!state = tolower($!ib!state);",
        '    if $!ib!state == "down" then { set $.action = "ib_link_down"; set $.level = "error"; }',
        '    else if $!ib!state == "up" then { set $.action = "ib_link_up"; set $.level = "info"; }',
        '    else if $!ib!state == "active" then { set $.action = "ib_port_state"; set $.level = "info"; }',
        '    else { set $.action = "ib_port_state"; set $.level = "warning"; }',
        "  }",
        '  if $.rule == "nvidia_driver" and $.body contains "fallen off the bus" then {',
        '    set $.action = "gpu_fallen_off_bus"; set $.level = "critical";',
        "  }",
        "  if exists($!nvidia!xid!code) then {",
        '    set $!nvidia!xid!category = lookup("xid_category", cstr($!nvidia!xid!code));',
        '    set $!nvidia!xid!action = lookup("xid_action", cstr($!nvidia!xid!code));',
        "  }",
        '  if $.action != "" then {',
        "    set $!event!action = $.action;",
        "    set $!log!level = $.level;",
        '    if $.level == "info" then { set $.type = "info"; } else { set $.type = "error"; }',
        *_set_event("$.category", "$.type"),
        "  } else {",
        f'    set $!event!action = "{catalogue.default_action}"; set $!log!level = "info";',
        "  }",
        *_unparsed_unless('$.envelope != "" or $.action != ""'),
    ]


def _fm_classify(catalogue: ClassCatalogue) -> list[str]:
    """The envelope's level names the level; an NVSwitch error line its own; else fm_error/fm_message."""
    lines = [
        '  set $.level = "info";',
        "  if exists($!_env!f__tmp_level) then { set $.level = tolower($!_env!f__tmp_level); }",
        '  if $.level == "warn" then { set $.level = "warning"; }',
        "  set $!log!level = $.level;",
        '  set $.matched = "";',
    ]
    for rule in catalogue.events:
        if not rule.action:
            continue
        fatal = "true" if rule.action == "nvswitch_fatal" else "false"
        lines += [
            f'  if $.rule == "{rule.id}" then {{',
            *_json_set("$!nvidia!sxid!fatal", fatal),
            "    set $!nvidia!sxid!message = $.body;",
            f'    set $!event!action = "{rule.action}"; set $!log!level = "{rule.level}";',
            *_set_event(f'"{rule.category}"', '"error"'),
            '    set $.matched = "1";',
            "  }",
        ]
    return [
        *lines,
        '  if $.matched == "" then {',
        '    if $.level == "error" or $.level == "fatal" or $.level == "critical" then {',
        '      set $!event!action = "fm_error";',
        *["  " + line for line in _set_event('"host"', '"error"')],
        "    } else {",
        '      set $!event!action = "fm_message";',
        "    }",
        "  }",
        *_unparsed_unless('$.envelope != "" or $.matched != ""'),
    ]


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


def _sel_time_block() -> list[str]:
    """The SEL's date and time columns, 'MM/dd/yyyy HH:mm:ss' (UTC, as the pipeline's date processor)."""
    return [
        "  if exists($!_env!f__tmp_date) then {",
        '    set $.parts = re_extract($!_env!f__tmp_date & " " & $!_env!f__tmp_time, '
        "'^[0-9]{2}/[0-9]{2}/[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}$', 0, 0, \"\");",
        '    set $.day = substring($.parts, 6, 4) & "-" & substring($.parts, 0, 2) & "-" '
        "& substring($.parts, 3, 2);",
        "    set $.hms = substring($.parts, 11, 8);",
        '    if $.parts == "" or format_time(parse_time($.day & "T00:00:00Z"), "date-rfc3339") '
        '!= $.day & "T00:00:00Z" or format_time(parse_time($.day & "T" & $.hms & "Z"), "date-rfc3339") '
        '!= $.day & "T" & $.hms & "Z" then { set $.tsbad = "1"; }',
        '    else { set $.ts = $.day & "T" & $.hms & ".000Z"; }',
        "  }",
    ]


def _audit_classify(catalogue: ClassCatalogue) -> list[str]:
    lines = ['  set $.matched = "";']
    for rule in catalogue.events:
        if not rule.action:
            continue
        lines += [
            f'  if $.rule == "{rule.id}" then {{',
            f'    set $!event!action = "{rule.action}";',
            *([f'    set $!event!outcome = "{rule.derive}";'] if rule.derive else []),
            *_set_event(f'"{rule.category}"', '"start"'),
            *([f'    set $!log!level = "{rule.level}";'] if rule.level else []),
            '    set $.matched = "1";',
            "  }",
        ]
    return [*lines, *_default_action(catalogue)]


def _default_action(catalogue: ClassCatalogue) -> list[str]:
    """The pipeline's parse_failure script: unparsed when neither frame nor event matched; the class's
    default action otherwise; level info unless set."""
    return [
        '  if $.envelope == "" and $.matched == "" then {',
        '    set $!event!action = "unparsed";',
        *_json_set("$!tags", '["parse_failure"]'),
        "  }",
        f'  if not exists($!event!action) then {{ set $!event!action = "{catalogue.default_action}"; }}',
        '  if not exists($!log!level) then { set $!log!level = "info"; }',
    ]


def _bmc_classify(catalogue: ClassCatalogue) -> list[str]:
    """Sensor type and name from the sensor column; bmc_sel with a level from the event's words."""
    types = "|".join(_ere_literal(t) for t in SEL_SENSOR_TYPES)
    sensor = "$!_env!f__tmp_sensor"
    errors = " or ".join(f'$.e contains "{w}"' for w in SEL_ERROR_WORDS)
    infos = " or ".join(f'$.e contains "{w}"' for w in SEL_INFO_WORDS)
    return [
        f"  if exists({sensor}) then {{",
        f"    set $.st = re_extract({sensor}, '^({types}) (.*)$', 0, 1, \"\");",
        '    if $.st != "" then {',
        "      set $!bmc!sel!sensor_type = $.st;",
        f"      set $!bmc!sel!sensor = re_extract({sensor}, '^({types}) (.*)$', 0, 2, \"\");",
        f"    }} else {{ set $!bmc!sel!sensor_type = {sensor}; }}",
        "  }",
        '  set $.matched = "";',
        "  if exists($!bmc!sel!event) then {",
        '    set $.matched = "1";',
        "    set $.e = tolower($!bmc!sel!event);",
        '    set $.level = "warning";',
        '    if $!bmc!sel!direction == "Deasserted" then { set $.level = "info"; }',
        f'    else if {errors} then {{ set $.level = "error"; }}',
        f'    else if {infos} then {{ set $.level = "info"; }}',
        '    set $!event!action = "bmc_sel";',
        "    set $!log!level = $.level;",
        '    if $.level == "info" then { set $.type = "info"; } else { set $.type = "error"; }',
        *_set_event('"host"', "$.type"),
        "  }",
        *_default_action(catalogue),
    ]


def _app_time_block() -> list[str]:
    """The line's 'yyyy-MM-dd HH:mm:ss' (both parts checked by the rulebase; a day past the month's end
    is tagged), else its RFC 3339 time (as the kernel's)."""
    return [
        "  if exists($!_env!f__tmp_date) then {",
        "    set $.day = $!_env!f__tmp_date; set $.hms = $!_env!f__tmp_time;",
        '    if format_time(parse_time($.day & "T00:00:00Z"), "date-rfc3339") != $.day & "T00:00:00Z" '
        'then { set $.tsbad = "1"; }',
        '    else { set $.ts = $.day & "T" & $.hms & ".000Z"; }',
        "  }",
        *_kernel_time_blocks(),
    ]


RANK_PATH = "/jobs/([^ ]+)/rank-([0-9]+)[.]log$"  # the pipeline's job_from_path grok, as a POSIX ERE


def _app_classify(catalogue: ClassCatalogue) -> list[str]:
    """The pipeline's app_classify script: progress (finite or not), NCCL timeout, CUDA, NCCL error/info,
    a generic error; the job and rank from the file's path; the node-local rank of an NCCL line."""
    loss, grad, step_time = "$!_ev!f__tmp_loss", "$!_ev!f__tmp_grad_norm", "$!_ev!f__tmp_step_time"
    return [
        f"  set $.job = re_extract($.filename, '{RANK_PATH}', 0, 1, \"\");",
        '  if $.job != "" then {',
        "    set $!fleetsight!hpc_job = $.job;",
        f"    set $!fleetsight!rank = cnum(re_extract($.filename, '{RANK_PATH}', 0, 2, \"0\"));",
        "  } else {",
        "    set $.job = re_extract($.filename, 'slurm-([0-9]+)(_[0-9]+)?[.]out$', 0, 1, \"\");",
        '    if $.job != "" then { set $!fleetsight!hpc_job = $.job; }',
        "  }",
        *_copy_fields(catalogue.events, "$!_ev"),
        '  set $.action = ""; set $.level = "info"; set $.category = "process";',
        f"  if exists({loss}) then {{",
        f"    set $.raw = tolower({loss});",
        '    if $.raw contains "nan" or $.raw contains "inf" then {',
        *["  " + line for line in _json_set("$!training!loss_finite", "false")],
        f"      set $!training!loss_text = {loss};",
        '      set $.action = "loss_nonfinite"; set $.level = "error";',
        "    } else {",
        *["  " + line for line in _json_set("$!training!loss_finite", "true")],
        *["  " + line for line in _json_number("$!training!loss", "$.raw")],
        '      set $.action = "training_progress";',
        "    }",
        f"    if exists({grad}) then {{",
        f"      set $.g = tolower({grad});",
        '      if not ($.g contains "nan" or $.g contains "inf") then {',
        *["    " + line for line in _json_number("$!training!grad_norm", "$.g")],
        "      }",
        "    }",
        f"    if exists({step_time}) then {{",
        *["    " + line for line in _json_number("$!training!step_time_ms", step_time)],
        "    }",
        "  } else if exists($!nccl!timeout_ms) then {",
        '    set $.action = "nccl_timeout"; set $.level = "error"; set $.category = "network";',
        '  } else if exists($!cuda) or ($!nccl!message startswith "Cuda failure") then {',
        '    set $.action = "cuda_error"; set $.level = "error"; set $.category = "host";',
        "    if not exists($!cuda) then { set $!cuda!error = $!nccl!message; }",
        "  } else if exists($!nccl!message) then {",
        '    set $.action = "nccl_error"; set $.level = "error"; set $.category = "network";',
        "  } else if exists($!nccl!info) then {",
        '    set $.action = "nccl_info"; set $.category = "network";',
        '  } else if $.body contains "Traceback (most recent call last)" or $.body startswith "RuntimeError" '
        'or $.body contains "Error: " then {',
        '    set $.action = "app_error"; set $.level = "error";',
        "  }",
        "  if exists($!nccl!local_rank) and not exists($!fleetsight!rank) then {",
        "    set $!fleetsight!local_rank = $!nccl!local_rank;",
        "  }",
        '  set $.matched = "";',
        '  if $.action != "" then {',
        '    set $.matched = "1";',
        "    set $!event!action = $.action;",
        "    set $!log!level = $.level;",
        '    if $.level == "info" then { set $.type = "info"; } else { set $.type = "error"; }',
        *_set_event("$.category", "$.type"),
        "  }",
        *_default_action(catalogue),
    ]


def _json_number(path: str, text: str) -> list[str]:
    """A number from its text, parsed by json-c (strtod), as Double.parseDouble in the pipeline."""
    container = "$!_json_" + re.sub(r"[^a-z]", "_", path.lower())
    return [
        f"    set $.ok = parse_json('{{\"v\": ' & {text} & '}}', '{container}');",
        f"    set {path} = {container}!v;",
        f"    unset {container};",
    ]


TIME_BLOCKS = {
    "application": _app_time_block,
    "kernel": _kernel_time_blocks,
    "fabricmanager": _fm_time_block,
    "audit": _kernel_time_blocks,
    "bmc": _sel_time_block,
}
CLASSIFIERS = {
    "application": _app_classify,
    "kernel": _kernel_classify,
    "fabricmanager": _fm_classify,
    "audit": _audit_classify,
    "bmc": _bmc_classify,
}


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
        *_json_set("$!tags", '["timestamp_unparsed"]'),
        "  }",
        *_copy_fields(tuple(r for r in catalogue.envelopes), "$!_env"),
        *(_copy_fields(catalogue.events, "$!_ev") if name != "application" else []),
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


def _xid_table(what: str) -> str:
    unknown = getattr(xid_catalog.UNKNOWN, what)
    table = [
        {"index": str(code), "value": getattr(info, what)}
        for code, info in sorted(xid_catalog.CATALOG.items())
    ]
    return json.dumps({"version": 1, "nomatch": unknown, "type": "string", "table": table}, indent=1) + "\n"


# -- writing and checking --------------------------------------------------------------------------


def generated_files() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    files: dict[Path, str] = {}
    for path in sorted(INGEST_DIR.glob("*.json")):
        files[path] = (
            json.dumps(with_ingest_time(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n"
        )
    for catalogue in CATALOGUES.values():
        path = INGEST_DIR / f"{catalogue.log_class}.json"
        pipeline = ingest_pipeline(catalogue, json.loads(path.read_text()))
        files[path] = json.dumps(pipeline, indent=2, ensure_ascii=False) + "\n"
        name = catalogue.log_class
        if catalogue.edge_engine == "regex":
            continue
        files[EDGE_DIR / f"{name}-envelope.rb"] = lognorm_rulebase(
            catalogue.envelopes, f"{name} log envelopes"
        )
        if catalogue.events:
            files[EDGE_DIR / f"{name}-events.rb"] = lognorm_rulebase(
                main_events(catalogue), f"{name} log events"
            )
        if lower_events(catalogue):
            files[EDGE_DIR / f"{name}-events-lower.rb"] = lognorm_rulebase(
                lower_events(catalogue), f"{name} log events, matched in lower case"
            )
    for what in ("category", "action"):
        files[EDGE_DIR / f"xid_{what}.json"] = _xid_table(what)
    return files


def stale() -> list[Path]:
    return [path for path, text in generated_files().items() if not path.exists() or path.read_text() != text]


def write() -> list[Path]:
    changed = stale()
    files = generated_files()
    EDGE_DIR.mkdir(exist_ok=True)
    for path in changed:
        path.write_text(files[path])
    return changed
