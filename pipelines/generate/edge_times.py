"""The line's own time on the edge, per log class, as RainerScript: RFC 3339, BSD syslog, dmesg -T,
Fabric Manager's and the SEL's formats, each checked the way the ingest pipeline's date processor
checks it (a day that does not exist is tagged, the read time stays). Its own module: time formats
change with the sources, independently of how a line is classified.
"""

from __future__ import annotations

from collections.abc import Callable

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


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


TIME_BLOCKS: dict[str, Callable[[], list[str]]] = {
    "application": _app_time_block,
    "kernel": _kernel_time_blocks,
    "fabricmanager": _fm_time_block,
    "audit": _kernel_time_blocks,
    "bmc": _sel_time_block,
}
