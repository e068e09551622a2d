"""The ingest pipeline of a catalogued class (``pipelines/ingest/<class>.json``), rewritten in place: the
grok processors, the date processors and the classify script (painless) with its parameters, found by
their tags; the hand-written painless around them stays. Its own module: the central parser's shape
changes here without touching the edge's RainerScript.
"""

from __future__ import annotations

import re
from typing import Any

from fleetsight import xid_catalog

from ..catalogue import SEL_ERROR_WORDS, SEL_INFO_WORDS, SEL_SENSOR_TYPES, ClassCatalogue
from .patterns import grok_patterns, lower_events, main_events

# -- the classify script: its parameters and painless ----------------------------------------------


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
