"""The one pattern catalogue of the log path: what each known line looks like and what event it is.

Both parsers are generated from it (``pipelines/generate/``): the node-side rulebase of rsyslog's
``mmnormalize`` (liblognorm) with the RainerScript that turns its result into ECS fields, and the grok
processors and classify parameters of the ingest pipelines (``pipelines/ingest/<class>.json``), which stay
for sources that cannot run FleetSight's rsyslog configuration (switches, BMCs, appliances). The tests
run one corpus through both and require the same documents, field by field.

A pattern is literal text with fields ``{name:type}`` or ``{name:type:arg}``; name ``-`` parses and
drops, ``name=P`` keeps the literal prefix P in the value. Every type means the same in both engines
(no backtracking inside a field), which is what makes the two parsers agree:

=========  ===================================  ====================================
type       matches                              liblognorm parser
=========  ===================================  ====================================
int, long  one or more digits (JSON integer)    number (format number)
sint       int with an optional ``-``           number, a ``-`` variant
float      digits, optional ``.digits``         float (format number)
word       one or more characters up to a space word
alpha      one or more letters                  alpha
to:X       one or more characters up to X       char-to
until:S    the shortest run up to the string S  string-to
ws         one or more white-space characters   whitespace
rest       the rest of the line (may be empty)  rest
rfc5424    2024-08-30T11:43:09.123456+02:00     date-rfc5424
rfc3164    Aug 30 11:43:09                      date-rfc3164
date       2024-08-30 (month 01-12, day 01-31)  date-iso
time       11:43:09 (hour 00-23)                time-24hr
loss       a loss value: a JSON number, or      char-sep (up to a space , ; | or the end),
           nan/inf/infinity (any case, signed)  then checked against the same expression
ipv4       an IPv4 address                      ipv4
ipv6       an IPv6 address                      ipv6
cell       a ``|`` column: the text up to the   (regex classes only, see below)
           next ``|``, spaces around it dropped
tail       the last column: the rest, trimmed   (regex classes only)
=========  ===================================  ====================================

A pattern matches a prefix of the text (grok is anchored at the start only; the rulebase gets a
trailing ``rest``). Patterns are tried in order, the first match wins; liblognorm tries literal text
before fields, so a catalogue lists the more literal variant first and the engines pick the same.

A class whose lines are ``|``-separated columns (the BMC's SEL) is matched on the node by POSIX regular
expressions generated from the same patterns (``edge_engine="regex"``): liblognorm cannot trim a column.
The two regex engines agree because every such pattern is anchored at both ends and every field is
bounded by text it cannot contain (a cell neither starts nor ends with a space and holds no ``|``), so
the line splits one way only, whichever way an engine searches.

A rule marked ``lower`` is case-insensitive: both engines try it, when no other rule matched, on the
lower-cased text (its captures are lower-case too). ``until`` takes the first occurrence of its text
only (liblognorm's string-to does not backtrack; the grok is an atomic group).

Every log class is catalogued: kernel, Fabric Manager, application (job) logs, BMC SEL and audit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TOKEN = re.compile(r"\{([A-Za-z0-9_.@-]+(?:=[^:}]*)?):([a-z0-9]+)(?::([^}]*))?\}")
TYPES = {
    *("int", "long", "sint", "float", "word", "alpha", "to", "until", "ws", "rest", "rfc5424", "rfc3164"),
    *("ipv4", "ipv6", "cell", "tail", "date", "time", "loss"),
}
NUMERIC = {"int": "int", "long": "long", "sint": "int", "float": "double"}


@dataclass(frozen=True)
class Field:
    name: str  # ECS path, "-" = parse and drop
    type: str
    arg: str = ""
    prefix: str = ""  # literal text kept at the start of the value


Token = str | Field


def tokens(pattern: str) -> list[Token]:
    """Split a pattern into literal strings and fields; a bad type is an error at import time."""
    out: list[Token] = []
    pos = 0
    for match in TOKEN.finditer(pattern):
        if match.start() > pos:
            out.append(pattern[pos : match.start()])
        name, kind, arg = match.group(1), match.group(2), match.group(3) or ""
        if kind not in TYPES:
            raise ValueError(f"unknown field type {kind!r} in {pattern!r}")
        if kind in {"to", "until"} and not arg:
            raise ValueError(f"{kind} needs its end text in {pattern!r}")
        name, _, prefix = name.partition("=")
        out.append(Field(name, kind, arg, prefix))
        pos = match.end()
    if pos < len(pattern):
        out.append(pattern[pos:])
    return out


@dataclass(frozen=True)
class Rule:
    """One kind of line: its patterns (tried in order) and the event it is."""

    id: str
    patterns: tuple[str, ...]
    action: str = ""  # event.action ("" for envelopes)
    level: str = "info"  # log.level
    category: str = ""  # event.category
    derive: str = ""  # a named rule computed from the fields (see DERIVED)
    lower: bool = False  # matched against the lower-cased text (a case-insensitive rule); after the others

    def fields(self) -> list[Field]:
        seen: dict[str, Field] = {}
        for pattern in self.patterns:
            for token in tokens(pattern):
                if isinstance(token, Field) and token.name != "-":
                    seen.setdefault(token.name, token)
        return list(seen.values())


DERIVED = {
    "sxid_fatal": "nvidia.sxid.fatal = the message starts with 'Fatal'; then nvswitch_fatal/critical",
    "ib_state": "ib.state lower-cased; down -> ib_link_down/error, up -> ib_link_up/info, "
    "else ib_port_state (info when active, else warning)",
    "fallen_off_bus": "'fallen off the bus' in the body -> gpu_fallen_off_bus/critical",
    "success": "event.outcome success (an audit event)",
    "failure": "event.outcome failure (an audit event)",
}


@dataclass(frozen=True)
class ClassCatalogue:
    log_class: str
    envelopes: tuple[Rule, ...]  # the line's frame: time, host, uptime -> _tmp.body
    events: tuple[Rule, ...]  # what the body says
    default_action: str  # a framed line no event matched
    time_formats: dict[str, tuple[str, ...]] = field(default_factory=dict)  # time field -> date formats
    classify_tag: str = "xid_classify"  # the ingest pipeline's script processor that classifies
    edge_engine: str = "lognorm"  # "regex": POSIX regexes in RainerScript (columns to trim, see above)


def _uptime(head: str) -> tuple[str, ...]:
    """An envelope with an optional '[ uptime] ' after head (both spacings), then the body."""
    return (
        head + "[{fleetsight.uptime_s:float}] {_tmp.body:rest}",
        head + "[{-:ws}{fleetsight.uptime_s:float}] {_tmp.body:rest}",
        head + "{_tmp.body:rest}",
    )


def _xid_patterns() -> tuple[str, ...]:
    """NVRM Xid of every driver generation: R525+ (pid, name), R450-R520 (pid), older (neither), very old
    (no 'PCI:'), R535+ GSP ('<unknown>' pid and name); and the same anywhere in the body."""
    pids = ("pid='<unknown>', ", "pid=<unknown>, ", "pid={nvidia.xid.pid:int}, ")
    names = ("name=<unknown>, ", "name={nvidia.xid.process:to:,}, ", "")
    tails = [pid + name + "{nvidia.xid.message:rest}" for pid in pids for name in names]
    tails.append("{nvidia.xid.message:rest}")
    heads = [
        "NVRM: Xid (PCI:{nvidia.xid.pci_bdf:to:)}): {nvidia.xid.code:int}, ",
        "NVRM: Xid ({nvidia.xid.pci_bdf:to:)}): {nvidia.xid.code:int}, ",
    ]
    anchored = [head + tail for head in heads for tail in tails]
    anywhere = ["{-:until:NVRM: Xid (}" + pattern for pattern in anchored]
    return tuple(anchored + anywhere)


LUSTRE_CONNECTION = "Lustre: {lustre.device:to::}: Connection "

KERNEL = ClassCatalogue(
    log_class="kernel",
    envelopes=(
        Rule("syslog_iso", _uptime("{_tmp.ts:rfc5424} {_tmp.host:word} kernel: ")),
        Rule("syslog_bsd", _uptime("{_tmp.ts:rfc3164} {_tmp.host:word} kernel: ")),
        Rule("dmesg", _uptime("")[:2]),
        Rule("dmesg_ctime", ("[{-:alpha} {_tmp.ctime:to:]}] {_tmp.body:rest}",)),
        Rule("bare_kernel", ("kernel: {_tmp.body:rest}",)),
    ),
    events=(
        Rule("xid", _xid_patterns(), "xid", "error", "host"),
        Rule(
            "sxid",
            (
                "nvidia-nvswitch{nvidia.sxid.switch:int}: SXid (PCI:{nvidia.sxid.pci_bdf:to:)}): "
                "{nvidia.sxid.code:int}, {nvidia.sxid.message:rest}",
                "nvidia-nvswitch{nvidia.sxid.switch:int}: SXid ({nvidia.sxid.pci_bdf:to:)}): "
                "{nvidia.sxid.code:int}, {nvidia.sxid.message:rest}",
            ),
            "sxid",
            "error",
            "host",
            derive="sxid_fatal",
        ),
        Rule(
            "lustre_eviction",
            (
                "LustreError: {-:to::}: {lustre.device:to::}: This client was evicted by "
                "{lustre.target:to:;}; {lustre.message:rest}",
            ),
            "lustre_eviction",
            "error",
            "file",
        ),
        Rule(
            "lustre_op_failed",
            (
                "LustreError: {-:to::}: {lustre.device:to::}: operation {lustre.operation:word} to node "
                "{lustre.nid:word} failed: rc = {lustre.rc:sint}",
            ),
            "lustre_error",
            "error",
            "file",
        ),
        Rule(
            "lustre_timeout",
            tuple(
                prefix + "{-:to:@}@@@ Request sent has {lustre.message:to::}: {-:until:->}->"
                "{lustre.device:to:@}@{lustre.nid:to::}:"
                for prefix in ("Lustre: ", "LustreError: ")
            ),
            "lustre_timeout",
            "warning",
            "file",
        ),
        Rule(
            "lustre_connection_lost",
            (LUSTRE_CONNECTION + "to {lustre.target:word} (at {lustre.nid:to:)}) was lost",),
            "lustre_connection_lost",
            "warning",
            "file",
        ),
        Rule(
            "lustre_connection_restored",
            (LUSTRE_CONNECTION + "restored to {lustre.target:word} (at {lustre.nid:to:)})",),
            "lustre_connection_restored",
            "info",
            "file",
        ),
        Rule("lustre_error", ("LustreError: {lustre.message:rest}",), "lustre_error", "error", "file"),
        Rule(
            "ib_port_change",
            (
                "mlx5_core {ib.pci_bdf:until:: mlx5_port_change_event:}: mlx5_port_change_event:{-:to::}:"
                "(pid {-:int}): Link {ib.state:word}",
            ),
            "ib_port_state",
            "warning",
            "network",
            derive="ib_state",
        ),
        Rule(
            "ib_port_state",
            ("mlx5_ib: {ib.device:to::}: port {ib.port:int} state changed to {ib.state:word}",),
            "ib_port_state",
            "warning",
            "network",
            derive="ib_state",
        ),
        Rule(
            "ib_netdev_link",
            ("{ib.netdev=ib:to::}: Link {ib.state:word}",),
            "ib_port_state",
            "warning",
            "network",
            derive="ib_state",
        ),
        Rule(
            "nvidia_driver",
            ("NVRM: {nvidia.driver.message:rest}",),
            "nvidia_driver",
            "info",
            "host",
            derive="fallen_off_bus",
        ),
    ),
    default_action="kernel_message",
    time_formats={
        "rfc5424": ("ISO8601",),
        "rfc3164": ("MMM d HH:mm:ss", "MMM  d HH:mm:ss"),
        "ctime": ("MMM d HH:mm:ss yyyy", "MMM  d HH:mm:ss yyyy"),
    },
)

FABRICMANAGER = ClassCatalogue(
    log_class="fabricmanager",
    envelopes=(
        Rule(
            "fm_line",
            ("[{_tmp.fmtime:to:]}] [{_tmp.level:to:]}] [tid {process.thread.id:long}] {_tmp.body:rest}",),
        ),
    ),
    events=(
        *(
            Rule(
                rule_id,
                (
                    f"detected NVSwitch {severity} error {{nvidia.sxid.code:int}} on fid "
                    "{fabricmanager.fabric_id:int} on NVSwitch pci bus id {nvidia.sxid.pci_bdf:word} "
                    "physical id {nvidia.sxid.switch:int} port {nvidia.sxid.link:int}",
                ),
                action,
                level,
                "host",
            )
            for rule_id, severity, action, level in (
                ("fm_fatal", "fatal", "nvswitch_fatal", "critical"),
                ("fm_nonfatal", "non-fatal", "sxid", "error"),
            )
        ),
        # Any other line: its text, classified by the envelope's level (fm_error or fm_message).
        Rule("fm_other", ("{fabricmanager.message:rest}",)),
    ),
    default_action="fm_message",
    time_formats={"fmtime": ("MMM dd yyyy HH:mm:ss", "MMM d yyyy HH:mm:ss")},
    classify_tag="fm_classify",
)

# -- application (job) logs -------------------------------------------------------------------------

_RANK = ("[rank{-:int}]:{-:ws}", "[rank{-:int}]:", "")  # torchrun's per-rank prefix, with or without
_ERROR_TYPE = ("{error.type:to:: }: ", "")  # 'RuntimeError: ', 'torch.cuda.OutOfMemoryError: '


def _progress() -> tuple[str, ...]:
    """Megatron-LM's per-iteration line; its grad norm when there is one."""
    out = []
    for grad in ("{-:until:grad norm: }grad norm: {_tmp.grad_norm:loss}", ""):
        for after_slash in ("{-:ws}", ""):
            for before_bar in ("{-:ws}", ""):
                out.append(
                    f"iteration{{-:ws}}{{training.step:long}}/{after_slash}{{-:int}}{before_bar}|"
                    "{-:until:elapsed time per iteration (ms): }elapsed time per iteration (ms): "
                    "{training.step_time_ms:float}{-:until:lm loss: }lm loss: {_tmp.loss:loss}" + grad
                )
    return tuple(out)


# Where a rank's step went, after its step time (docs/anomaly.md, "The job's own pace"): all three or none.
_SPLIT = "".join(
    f"{{-:until:{key}=}}{key}={{training.{key}:float}}" for key in ("data_ms", "compute_ms", "comm_ms")
)


def _key_values() -> tuple[str, ...]:
    """'step=N ... loss=X [... step_time_ms=T]' anywhere in the (lower-cased) text, keys in one style; in
    the key=value style also a data-parallel replica's line, 'step=N replica=R ... loss=X grad_norm=G'
    (docs/anomaly.md, "Silent data corruption": what the per-replica check reads), and after the step
    time where the rank's step went, 'data_ms=D compute_ms=C comm_ms=M' (what the pace check reads)."""
    out = []
    for sep in ("=", ": ", " "):
        replicas = ("{-:until:replica=}replica={training.replica:long}", "") if sep == "=" else ("",)
        grads = ("{-:until:grad_norm=}grad_norm={_tmp.grad_norm:loss}", "") if sep == "=" else ("",)
        step_time = f"{{-:until:step_time_ms{sep}}}step_time_ms{sep}{{_tmp.step_time:float}}"
        tails = (step_time + _SPLIT, step_time, "") if sep == "=" else (step_time, "")
        for start in ("", f"{{-:until:step{sep}}}"):
            for replica in replicas:
                for grad in grads:
                    for tail in tails:
                        out.append(
                            f"{start}step{sep}{{training.step:long}}{replica}{{-:until:loss{sep}}}loss{sep}"
                            f"{{_tmp.loss:loss}}{grad}{tail}"
                        )
    return tuple(out)


_NCCL_HEAD = "{_tmp.nccl_host:to:: [}:{process.pid:int}:{process.thread.id:long} [{nccl.local_rank:int}] "

APPLICATION = ClassCatalogue(
    log_class="application",
    envelopes=(
        Rule("bracketed", ("[{_tmp.date:date} {_tmp.time:time}] {_tmp.body:rest}",)),
        Rule("iso", ("{_tmp.ts:rfc5424} {_tmp.body:rest}",)),
        Rule("plain", ("{_tmp.date:date} {_tmp.time:time} {_tmp.body:rest}",)),
    ),
    events=(
        Rule("progress", _progress()),
        Rule(
            "nccl_timeout",
            tuple(
                rank + "[E {-:to:]}] [Rank {fleetsight.rank:int}] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum={nccl.seq:long}, OpType={nccl.op:to:,}{-:until:Timeout(ms)=}"
                "Timeout(ms)={nccl.timeout_ms:long})"
                for rank in ("[rank{-:int}]:", "")
            ),
        ),
        Rule(
            "nccl_warn",
            (
                _NCCL_HEAD + "NCCL WARN {nccl.message:rest}",
                _NCCL_HEAD + "{nccl.source:word} NCCL WARN {nccl.message:rest}",
            ),
        ),
        Rule(
            "nccl_info",
            (
                _NCCL_HEAD + "NCCL INFO {nccl.info:rest}",
                _NCCL_HEAD + "{nccl.source:word} NCCL INFO {nccl.info:rest}",
            ),
        ),
        Rule(
            "cuda_error", tuple(r + t + "CUDA error: {cuda.error:rest}" for r in _RANK for t in _ERROR_TYPE)
        ),
        Rule(
            "cuda_oom",
            tuple(r + t + "{cuda.error=CUDA out of memory:rest}" for r in _RANK for t in _ERROR_TYPE),
        ),
        Rule(
            "nccl_error",
            tuple(r + t + "NCCL error{nccl.message:rest}" for r in _RANK for t in ("{-:to:: }: ", "")),
        ),
        Rule("key_values", _key_values(), lower=True),
    ),
    default_action="app_message",
    time_formats={"line": ("yyyy-MM-dd HH:mm:ss", "ISO8601")},
    classify_tag="app_classify",
)

# -- BMC System Event Log ---------------------------------------------------------------------------

SEL_SENSOR_TYPES = (
    *("Power Supply", "Power Unit", "Temperature", "Voltage", "Fan", "Processor", "Memory", "Drive Slot"),
    *("System Event", "Critical Interrupt", "Watchdog2", "Event Logging Disabled", "OS Boot"),
    *("System Firmware Progress", "Physical Security", "Add-in Card", "Chassis", "Module / Board"),
    *("Slot / Connector", "Current", "Microcontroller"),
)
"""The sensor column starts with its IPMI sensor type; what follows is the sensor's name."""
# The level of an asserted SEL event from words in its text (lower-cased); deasserted is info.
SEL_ERROR_WORDS = ("failure", "critical", "uncorrectable", "non-recoverable", "lost", "fault")
SEL_INFO_WORDS = ("presence detected", "log area reset")


def _sel_columns(*names: str) -> str:
    """`ipmitool sel elist`: id | date | time | sensor | event [| direction [| detail]], each column
    trimmed; the last one takes the rest of the line."""
    return "|".join(f"{{{name}:cell}}" for name in names[:-1]) + f"|{{{names[-1]}:tail}}"


_SEL = ("bmc.sel.id", "_tmp.date", "_tmp.time", "_tmp.sensor", "bmc.sel.event")

BMC = ClassCatalogue(
    log_class="bmc",
    envelopes=(
        Rule(
            "sel",
            (
                _sel_columns(*_SEL, "bmc.sel.direction", "bmc.sel.detail"),
                _sel_columns(*_SEL, "bmc.sel.direction"),
                _sel_columns(*_SEL),
            ),
        ),
    ),
    events=(),
    default_action="message",
    time_formats={"sel": ("MM/dd/yyyy HH:mm:ss",)},
    classify_tag="bmc_classify",
    edge_engine="regex",
)

# -- audit (auth.log: sshd, sudo) -------------------------------------------------------------------


def _ssh(outcome: str) -> tuple[str, ...]:
    return tuple(
        f"sshd[{{process.pid:int}}]: {outcome} {{_tmp.method:word}} for {invalid}{{user.name:word}} "
        f"from {{source.ip:{ip}}} port {{source.port:int}}"
        for invalid in ("invalid user ", "")
        for ip in ("ipv4", "ipv6")
    )


_SUDO = "{user.name:word} : {-:until:COMMAND=}COMMAND={process.command_line:rest}"

AUDIT = ClassCatalogue(
    log_class="audit",
    envelopes=(
        Rule("syslog_iso", ("{_tmp.ts:rfc5424} {_tmp.host:word} {_tmp.body:rest}",)),
        Rule("syslog_bsd", ("{_tmp.ts:rfc3164} {_tmp.host:word} {_tmp.body:rest}",)),
    ),
    events=(
        Rule("ssh_accepted", _ssh("Accepted"), "ssh_login", "info", "authentication", derive="success"),
        Rule("ssh_failed", _ssh("Failed"), "ssh_login_failed", "warning", "authentication", derive="failure"),
        Rule(
            "sudo",
            (f"sudo[{{process.pid:int}}]:{{-:ws}}{_SUDO}", f"sudo:{{-:ws}}{_SUDO}"),
            "sudo",
            "",
            "process",
        ),
        Rule(
            "program",
            ("{process.name:to:[}[{process.pid:int}]: {-:rest}", "{process.name:to::}: {-:rest}"),
        ),
    ),
    default_action="message",
    time_formats={"rfc5424": ("ISO8601",), "rfc3164": ("MMM d HH:mm:ss", "MMM  d HH:mm:ss")},
    classify_tag="audit_classify",
)

CATALOGUES: dict[str, ClassCatalogue] = {
    c.log_class: c for c in (KERNEL, FABRICMANAGER, APPLICATION, BMC, AUDIT)
}
