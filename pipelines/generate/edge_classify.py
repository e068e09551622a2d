"""The classify step of each log class on the edge, as RainerScript: the same event.action, log.level,
event.category and event.type that the ingest pipeline's classify script (painless, ingest_pipeline)
sets. Its own module: a class's classification rules change without touching the parsing or the times.
"""

from __future__ import annotations

from collections.abc import Callable

from ..catalogue import SEL_ERROR_WORDS, SEL_INFO_WORDS, SEL_SENSOR_TYPES, ClassCatalogue
from .patterns import ere_literal
from .rainerscript import copy_fields, json_number, json_set, set_event, unparsed_unless


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
        *["  " + line for line in json_set("$!nvidia!sxid!fatal", "true")],
        "    } else {",
        *["  " + line for line in json_set("$!nvidia!sxid!fatal", "false")],
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
        *set_event("$.category", "$.type"),
        "  } else {",
        f'    set $!event!action = "{catalogue.default_action}"; set $!log!level = "info";',
        "  }",
        *unparsed_unless('$.envelope != "" or $.action != ""'),
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
            *json_set("$!nvidia!sxid!fatal", fatal),
            "    set $!nvidia!sxid!message = $.body;",
            f'    set $!event!action = "{rule.action}"; set $!log!level = "{rule.level}";',
            *set_event(f'"{rule.category}"', '"error"'),
            '    set $.matched = "1";',
            "  }",
        ]
    return [
        *lines,
        '  if $.matched == "" then {',
        '    if $.level == "error" or $.level == "fatal" or $.level == "critical" then {',
        '      set $!event!action = "fm_error";',
        *["  " + line for line in set_event('"host"', '"error"')],
        "    } else {",
        '      set $!event!action = "fm_message";',
        "    }",
        "  }",
        *unparsed_unless('$.envelope != "" or $.matched != ""'),
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
            *set_event(f'"{rule.category}"', '"start"'),
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
        *json_set("$!tags", '["parse_failure"]'),
        "  }",
        f'  if not exists($!event!action) then {{ set $!event!action = "{catalogue.default_action}"; }}',
        '  if not exists($!log!level) then { set $!log!level = "info"; }',
    ]


def _bmc_classify(catalogue: ClassCatalogue) -> list[str]:
    """Sensor type and name from the sensor column; bmc_sel with a level from the event's words."""
    types = "|".join(ere_literal(t) for t in SEL_SENSOR_TYPES)
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
        *set_event('"host"', "$.type"),
        "  }",
        *_default_action(catalogue),
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
        *copy_fields(catalogue.events, "$!_ev"),
        '  set $.action = ""; set $.level = "info"; set $.category = "process";',
        f"  if exists({loss}) then {{",
        f"    set $.raw = tolower({loss});",
        '    if $.raw contains "nan" or $.raw contains "inf" then {',
        *["  " + line for line in json_set("$!training!loss_finite", "false")],
        f"      set $!training!loss_text = {loss};",
        '      set $.action = "loss_nonfinite"; set $.level = "error";',
        "    } else {",
        *["  " + line for line in json_set("$!training!loss_finite", "true")],
        *["  " + line for line in json_number("$!training!loss", "$.raw")],
        '      set $.action = "training_progress";',
        "    }",
        f"    if exists({grad}) then {{",
        f"      set $.g = tolower({grad});",
        '      if not ($.g contains "nan" or $.g contains "inf") then {',
        *["    " + line for line in json_number("$!training!grad_norm", "$.g")],
        "      }",
        "    }",
        f"    if exists({step_time}) then {{",
        *["    " + line for line in json_number("$!training!step_time_ms", step_time)],
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
        *set_event("$.category", "$.type"),
        "  }",
        *_default_action(catalogue),
    ]


CLASSIFIERS: dict[str, Callable[[ClassCatalogue], list[str]]] = {
    "application": _app_classify,
    "kernel": _kernel_classify,
    "fabricmanager": _fm_classify,
    "audit": _audit_classify,
    "bmc": _bmc_classify,
}
