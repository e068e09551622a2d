"""rsyslog configurations of the log path, rendered from the log classes (pipelines/logclasses.py).

- **node**: ``imfile`` (one input per log class, with file name and offset metadata) -> ``omkafka``, one
  topic per class, through a disk-assisted queue per class so that nothing is lost while Kafka is away.
  Each record is a JSON document carrying the raw line (``message``), ``host.name``, the cluster,
  ``log.file.path``, ``log.offset`` and ``event.id`` = node:file:offset, the line's origin, so that a
  line delivered twice (rsyslog is at-least-once) is indexed once.
- **shipper** (local stand-in for Logstash): ``imkafka`` -> ``omelasticsearch`` with the class's ingest
  pipeline (``pipelineName``) and the origin as the bulk document id.

``fleetsight logs rsyslog-config`` prints them for a real node (from /var/log) or the local stack
writes them for the twin's files; ``rsyslogd -N1 -f FILE`` validates them (the tests do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .catalogue import CATALOGUES
from .generate import EDGE_DIR
from .generate.edge import edge_ruleset, lookup_tables
from .kafka_security import RsyslogAuth, rsyslog_conf_params
from .logclasses import LOG_CLASSES, LogClass

CONSUMER_GROUP = "fleetsight-shipper"
# A record librdkafka cannot deliver in this time fails back to rsyslog (and its disk-assisted queue).
KAFKA_MESSAGE_TIMEOUT_MS = 5000
# How long a stopping rsyslogd waits for librdkafka to deliver, per omkafka action (they close one after
# the other). What is still inside then is purged into the failed-message file (keepFailedMessages) and
# sent after the restart, so nothing is lost by a short wait: with Kafka up the queue empties in ~0.3 s.
# (It was 20 s, while the purged records were lost to the file's format: RECORD_END below.)
KAFKA_CLOSE_TIMEOUT_MS = 2000
# omkafka re-sends the records it holds as failed (a Kafka outage, or its failed-message file after a
# restart) only when its action is next called: on an idle class that can be hours. immark calls every
# class's action this often; an action that was called in the last half interval skips it
# (action.writeAllMarkMessages="off"). The call sends one nudge record to NUDGE_TOPIC, which has no reader.
NUDGE_INTERVAL_S = 60
NUDGE_TOPIC = "fleetsight-node-nudge"


@dataclass(frozen=True)
class NodeOptions:
    brokers: list[str]
    work_dir: Path  # imfile state, queue spool files
    cluster: str
    files_root: str = ""  # "" on a real node; the twin's nodes/ folder locally
    node_from_path: bool = False  # locally one rsyslogd reads every twin node: name from nodes/<node>/
    pid_file: Path | None = None
    stats_file: Path | None = None
    queue_max_disk: str = "2g"
    # Parse the catalogued classes (pipelines/catalogue.py) here and ship ECS JSON to their edge topics;
    # False ships every class raw, for the ingest pipelines (the pre-#25 path; the benchmark compares).
    edge_parse: bool = True
    edge_dir: Path = EDGE_DIR  # where the node finds the rulebases and lookup tables
    # SASL_SSL + SCRAM to the nodes' listener (docs/security.md T2, T3); None: PLAINTEXT (tests of the
    # parsing alone, never a deployment).
    kafka_auth: RsyslogAuth | None = None
    raw_classes: tuple[str, ...] = ()  # catalogued classes shipped raw all the same (for the pipelines)
    nudge_interval_s: int = NUDGE_INTERVAL_S


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def brokers_array(brokers: list[str]) -> str:
    return "[" + ", ".join(quote(b) for b in brokers) + "]"


def conf_params(params: list[str], auth: RsyslogAuth | None, indent: str) -> str:
    """An omkafka/imkafka ``confParam=[...]``: librdkafka settings, then the credential's."""
    items = [quote(param) for param in params]
    if auth is not None:
        items += rsyslog_conf_params(auth)
    return f"{indent}confParam=[" + f",\n{indent}           ".join(items) + "]"


NODE_RECORD = (
    '{"@timestamp":"%timegenerated:::date-rfc3339%",'
    '"message":"%rawmsg:::json%",'
    '"host":{"name":"%$.node:::json%"},'
    '"log":{"file":{"path":"%$!metadata!filename:::json%"},"offset":%$!metadata!fileoffset%},'
    '"event":{"id":"%$.doc_id:::json%"},'
    '"fleetsight":{"cluster":"%$.cluster:::json%"}}'
)


# Every record a node sends ends in a newline, as rsyslog's own templates do. omkafka's failed-message file
# (keepFailedMessages) writes "topic<TAB>key<TAB>payload" with no separator of its own and reads it back
# line by line: records without the newline were glued into one line at a shutdown during a Kafka outage
# and all but the first were lost. The shipper's rsyslog drops the newline on reception
# (parser.dropTrailingLFOnReception), and JSON readers ignore it.
RECORD_END = "\n"
NODE_RECORD_TEMPLATE = (
    f'template(name="fleetsight_node_record" type="string" string={quote(NODE_RECORD + RECORD_END)})'
)

READ_TIME_TEMPLATE = "fleetsight_read_time"


def edge_preamble(edge_dir: Path = EDGE_DIR) -> list[str]:
    """What the edge rulesets need at the top of a node configuration: mmnormalize, the Xid lookup tables
    and the template of the time rsyslog read a line."""
    return [
        'module(load="mmnormalize")',
        lookup_tables(edge_dir),
        f'template(name="{READ_TIME_TEMPLATE}" type="string" string="%timegenerated:::date-rfc3339%")',
        f'template(name="fleetsight_edge_record" type="string" string={quote("%$!%" + RECORD_END)})',
    ]


def edge_parse_ruleset(log_class: str, edge_dir: Path = EDGE_DIR) -> str:
    """The ruleset that parses one catalogued class's line on the node into its ECS document ($!)."""
    body = edge_ruleset(CATALOGUES[log_class], edge_dir, READ_TIME_TEMPLATE)
    return f'ruleset(name="edge_parse_{log_class}") {{\n{body}\n}}'


def edge_file_config(
    work_dir: Path,
    source: Path,
    out_file: Path,
    raw_file: Path | None,
    log_class: str,
    node: str,
    cluster: str,
    parse: bool = True,
) -> str:
    """A node-side rsyslog that parses one file with the edge ruleset and writes, per line, the ECS
    document (out_file) and the raw node record the ingest pipelines take (raw_file): the equivalence
    test runs the same lines through both engines with these."""
    return "\n".join(
        [
            f'global(workDirectory={quote(str(work_dir))} maxMessageSize="64k")',
            'module(load="imfile" mode="inotify")',
            *edge_preamble(),
            NODE_RECORD_TEMPLATE,
            edge_parse_ruleset(log_class),
            f'input(type="imfile" file={quote(str(source))} tag="{log_class}" ruleset="edge_file" '
            'addMetadata="on" freshStartTail="off")',
            'ruleset(name="edge_file") {',
            f"  set $.node = {quote(node)};",
            f"  set $.cluster = {quote(cluster)};",
            '  set $.doc_id = $.node & ":" & $!metadata!filename & ":" & $!metadata!fileoffset;',
            f'  action(type="omfile" file={quote(str(raw_file))} template="fleetsight_node_record")'
            if raw_file
            else "  # no raw record",
            f"  call edge_parse_{log_class}" if parse else "  # not parsed (the benchmark's baseline)",
            f'  action(type="omfile" file={quote(str(out_file))} '
            f'template="{"fleetsight_edge_record" if parse else "fleetsight_node_record"}")',
            "}",
            "",
        ]
    )


def node_paths(log_class: LogClass, options: NodeOptions) -> list[str]:
    if options.files_root:
        return [f"{options.files_root.rstrip('/')}/*/{path}" for path in log_class.twin_files]
    return list(log_class.node_files)


def node_config(options: NodeOptions) -> str:
    node_expr = (
        're_extract($!metadata!filename, "/nodes/([^/]+)/", 0, 1, $hostname)'
        if options.node_from_path
        else "$hostname"
    )
    lines = [
        "# FleetSight node-side log shipping: files -> Kafka, one topic per log class.",
        "# Generated by pipelines/rsyslog_conf.py; validate with `rsyslogd -N1 -f THIS_FILE`.",
        f'global(workDirectory={quote(str(options.work_dir))} maxMessageSize="64k")',
        'module(load="imfile" mode="inotify")',
        'module(load="omkafka")',
        f'module(load="immark" interval="{options.nudge_interval_s}" use.syslogcall="off" '
        'ruleset="fleetsight_nudge" markMessageText="fleetsight nudge")',
    ]
    if options.stats_file:
        lines.append(
            f'module(load="impstats" interval="10" format="json" log.syslog="off" '
            f"log.file={quote(str(options.stats_file))})"
        )
    lines += [
        "",
        NODE_RECORD_TEMPLATE,
        'template(name="fleetsight_kafka_topic" type="string" string="%$.kafka_topic%")',
        'ruleset(name="fleetsight_nudge") {',
        *(f"  call to_kafka_{log_class.name}" for log_class in LOG_CLASSES),
        "}",
        "",
    ]
    if options.edge_parse:
        lines += [
            *edge_preamble(options.edge_dir),
            *[edge_parse_ruleset(name, options.edge_dir) for name in CATALOGUES],
            "",
        ]
    for log_class in LOG_CLASSES:
        edge = (
            options.edge_parse and log_class.name in CATALOGUES and log_class.name not in options.raw_classes
        )
        ruleset = f"to_kafka_{log_class.name}"
        for index, path in enumerate(node_paths(log_class, options)):
            lines.append(
                f'input(type="imfile" file={quote(path)} tag="{log_class.name}" ruleset="{ruleset}" '
                f'addMetadata="on" reopenOnTruncate="on" freshStartTail="off" persistStateInterval="1000" '
                f'deleteStateOnFileDelete="on")'
            )
            del index
        lines += [
            f'ruleset(name="{ruleset}") {{',
            f"  set $.node = {node_expr};",
            '  if $inputname == "immark" then {',
            f'    set $.kafka_topic = "{NUDGE_TOPIC}";',
            "    set $!fleetsight!nudge = $.node;",
            "  } else {",
            f'    set $.kafka_topic = "{log_class.edge_topic if edge else log_class.topic}";',
            f"    set $.cluster = {quote(options.cluster)};",
            '    set $.doc_id = $.node & ":" & $!metadata!filename & ":" & $!metadata!fileoffset;',
            # Parsed here: the ECS document in $! (a line no pattern matches goes whole, tagged).
            f"    call edge_parse_{log_class.name}" if edge else "    # raw: the ingest pipeline parses it",
            "  }",
            f'  action(type="omkafka" name="kafka_{log_class.name}" statsName="omkafka_{log_class.name}"',
            '         dynaTopic="on" topic="fleetsight_kafka_topic" action.writeAllMarkMessages="off"',
            f"         broker={brokers_array(options.brokers)}",
            f'         template="{"fleetsight_edge_record" if edge else "fleetsight_node_record"}"',
            conf_params(
                [
                    "compression.codec=zstd",
                    "queue.buffering.max.ms=20",
                    "socket.keepalive.enable=true",
                    f"message.timeout.ms={KAFKA_MESSAGE_TIMEOUT_MS}",
                ],
                options.kafka_auth,
                "         ",
            ),
            # librdkafka's own retries time out; then rsyslog re-submits and the action suspends, and
            # the disk-assisted queue below keeps everything until Kafka is back.
            '         resubmitOnFailure="on" keepFailedMessages="on"',
            # On shutdown, what librdkafka still holds after closeTimeout is purged; keepFailedMessages
            # writes it to failedMsgFile and sends it after the restart (with the next line or nudge).
            f'         closeTimeout="{KAFKA_CLOSE_TIMEOUT_MS}"',
            f"         failedMsgFile={quote(str(options.work_dir / f'kafka_{log_class.name}.failed'))}",
            '         action.resumeRetryCount="-1" action.resumeInterval="2"',
            f'         queue.type="LinkedList" queue.filename="kafka_{log_class.name}" queue.size="200000"',
            '         queue.highWatermark="150000" queue.lowWatermark="50000"',
            f'         queue.maxDiskSpace="{options.queue_max_disk}" queue.saveOnShutdown="on"',
            '         queue.timeoutEnqueue="0" queue.dequeueBatchSize="1024")',
            "}",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ShipperOptions:
    brokers: list[str]
    es_host: str
    es_port: int
    work_dir: Path
    error_file: Path
    stats_file: Path | None = None
    consumer_group: str = CONSUMER_GROUP
    kafka_auth: RsyslogAuth | None = None  # the shipper's credential (consume only); None: PLAINTEXT


SHIPPER_KAFKA_PARAMS = ["auto.offset.reset=earliest", "fetch.wait.max.ms=50", "socket.keepalive.enable=true"]


# Bulk requests of the edge leg: the documents need no pipeline, so OpenSearch's cost is the indexing
# itself (~35 CPU-us a document); 5,000 records (~4 MB) per bulk amortise the per-request overhead (HTTP,
# the shard's write lock, translog fsync with durability=request), and two workers keep both of a
# 2-core node's write threads busy.
EDGE_BULK_RECORDS = 5000
EDGE_WORKERS = 2


# The node writes its document with rsyslog's JSON encoder, always in this form (`"key": "value"`, objects
# opened with `{ `, every `/` escaped): the two values the shipper needs are found by these keys without
# parsing the document. Inside a JSON string every `"` is escaped, so neither key can match a string's
# content; ECS has one @timestamp and one top-level event.
EDGE_TIMESTAMP_KEY = '"@timestamp": "'
EDGE_ID_KEY = '"event": { "id": "'
NOT_FOUND = "***FIELD NOT FOUND***"  # what RainerScript's field() returns


# The id of a parsed record: its origin; a record with none (not a node's) gets a random one, since
# OpenSearch refuses an empty id (the record would stay in the error file); a replay may index it twice.
NODE_RECORD_ID = [
    "  set $.id = $!event!id;",
    '  if $.id == "" then { set $.id = "not_a_node_record:" & $uuid; }',
]


def rainer_string(text: str) -> str:
    """A RainerScript string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def edge_fast_path() -> list[str]:
    r"""Read the id and the time of a node's document without parsing it (mmjsonparse builds the whole
    tree: ~11 of the shipper's CPU-us a record, bench/logs_shipper_parse.py). `$.fast` says whether it
    applies: the record starts as a JSON object, both keys are there, the time is one rsyslog reads, and
    the id has no escape other than `\/`. Anything else takes the full parse, as before; OpenSearch parses
    every document anyway, and a record that looks like a node's but is no JSON is rejected there into the
    shipper's error file."""
    found = lambda key: f"field(field($rawmsg, {rainer_string(key)}, 2), 34, 1)"  # noqa: E731
    return [
        f"  set $.ts = {found(EDGE_TIMESTAMP_KEY)};",
        f'  set $.id = replace({found(EDGE_ID_KEY)}, "\\\\/", "/");',
        "  set $.unix = parse_time($.ts);",
        '  set $.fast = substring($rawmsg, 0, 1) == "{" and $.unix != 0'
        f' and $.id != "{NOT_FOUND}" and $.id != "" and field($.id, 92, 2) == "{NOT_FOUND}";',
    ]


# An edge document's id: the second of the line's own time, then its origin. OpenSearch looks every
# given id up in each segment of the index before writing; Lucene answers "not here" at once for an id
# outside a segment's smallest..largest id, so ids that grow with time are checked against the few
# recent segments only (bench/logs_index_cost.py, "ids"). Both parts come from the record, so a replay
# gives the same id. A record without a time of its own keeps the bare origin: the time it would get
# (now) changes from one delivery to the next.
EDGE_ID_SEPARATOR = ":"
TIMED_EDGE_ID = f'  set $.doc_id = $.unix & "{EDGE_ID_SEPARATOR}" & $.id;'


def edge_document_id(document: dict) -> str:
    """The id the edge shipper gives a node's document (TIMED_EDGE_ID), to find it by: the whole seconds
    of its @timestamp since the epoch, then its origin (event.id)."""
    origin = document["event"]["id"]
    try:
        moment = datetime.fromisoformat(document["@timestamp"].replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError, AttributeError):
        return origin
    if moment.tzinfo is None:  # parse_time reads RFC 3339 only: a time without its zone is none
        return origin
    return f"{math.floor(moment.timestamp())}{EDGE_ID_SEPARATOR}{origin}"


def edge_full_parse() -> list[str]:
    """The edge path off the fast path: parse the record; one that is no JSON becomes a tagged document."""
    return [
        '  action(type="mmjsonparse" cookie="" useRawMsg="on")',
        '  if $parsesuccess != "OK" then {',
        "    set $!message = $rawmsg;",
        '    set $!tags = "not_a_node_record";',
        '    set $.doc = exec_template("fleetsight_es_doc");',
        "  }",
        *NODE_RECORD_ID,
        "  set $.unix = parse_time($!@timestamp);",
        "  if $.unix == 0 then {",
        "    set $.doc_id = $.id;",
        '    set $.unix = parse_time(exec_template("fleetsight_now"));',
        "  } else {",
        "  " + TIMED_EDGE_ID,
        "  }",
    ]


def edge_shipper(log_class: LogClass, options: ShipperOptions, first: bool = True) -> list[str]:
    """The edge topic of a catalogued class: ECS JSON parsed on the node, bulk-indexed with no ingest
    pipeline into the class's daily index (the line's own day, UTC), id = the second of the line's own time
    and its origin (TIMED_EDGE_ID)."""
    name = f"edge_{log_class.name}"
    return [
        *(
            [
                'template(name="fleetsight_edge_doc" type="string" string="%$.doc%")',
                'template(name="fleetsight_edge_doc_id" type="string" string="%$.doc_id:::json%")',
                'dyn_stats(name="fleetsight_edge_path" resettable="off")',
            ]
            if first
            else []
        ),
        f'template(name="index_{name}" type="string" string="{log_class.topic}-%$.day%")',
        f'input(type="imkafka" topic="{log_class.edge_topic}" broker={brokers_array(options.brokers)}',
        f'      consumergroup="{options.consumer_group}" ruleset="ship_{name}"',
        conf_params(SHIPPER_KAFKA_PARAMS, options.kafka_auth, "      ") + ")",
        f'ruleset(name="ship_{name}" queue.type="LinkedList" queue.filename="ship_{name}"',
        '        queue.size="200000"',
        f'        queue.workerThreads="{EDGE_WORKERS}" '
        f'queue.workerThreadMinimumMessages="{EDGE_BULK_RECORDS}"',
        '        queue.saveOnShutdown="on" queue.maxDiskSpace="2g" '
        f'queue.dequeueBatchSize="{EDGE_BULK_RECORDS}") {{',
        # The node's JSON is the document as it came (no re-serialising it); only id and day are read.
        "  set $.doc = $rawmsg;",
        *edge_fast_path(),
        "  if $.fast then {",
        f'    set $.path = dyn_inc("fleetsight_edge_path", "{log_class.name}_fast");',
        "  " + TIMED_EDGE_ID,
        "  } else {",
        f'    set $.path = dyn_inc("fleetsight_edge_path", "{log_class.name}_parsed");',
        *("  " + line for line in edge_full_parse()),
        "  }",
        '  set $.day = replace(substring(format_time($.unix, "date-rfc3339"), 0, 10), "-", ".");',
        f'  action(type="omelasticsearch" name="es_{name}" server="{options.es_host}" '
        f'serverport="{options.es_port}" usehttps="off" esVersion.major="8"',
        f'         searchIndex="index_{name}" dynSearchIndex="on"',
        '         template="fleetsight_edge_doc" bulkmode="on" maxbytes="10m"',
        '         dynbulkid="on" bulkid="fleetsight_edge_doc_id" writeoperation="index"',
        f'         retryfailures="on" retryruleset="retry_{name}"',
        f"         errorFile={quote(str(options.error_file))}",
        '         action.resumeRetryCount="-1" action.resumeInterval="2")',
        "}",
        f'ruleset(name="retry_{name}") {{',
        "  if $.omes!status == 429 or $.omes!status >= 500 then {",
        f"    call ship_{name}",
        "  }",
        "}",
        "",
    ]


def shipper_config(options: ShipperOptions) -> str:
    lines = [
        "# FleetSight log shipper (local stand-in for Logstash): Kafka -> OpenSearch/Elasticsearch through",
        "# each class's ingest pipeline; id = the line's origin (a replay overwrites, never doubles).",
        "# Generated by pipelines/rsyslog_conf.py; validate with `rsyslogd -N1 -f THIS_FILE`.",
        # A node's record ends in a newline (RECORD_END); dropping it is rsyslog's default, stated here
        # because the bulk body the shipper writes must not carry it.
        f'global(workDirectory={quote(str(options.work_dir))} maxMessageSize="64k" '
        'parser.dropTrailingLFOnReception="on")',
        'module(load="imkafka")',
        'module(load="omelasticsearch")',
        'module(load="mmjsonparse")',
    ]
    if options.stats_file:
        lines.append(
            f'module(load="impstats" interval="10" format="json" log.syslog="off" '
            f"log.file={quote(str(options.stats_file))})"
        )
    lines += [
        "",
        'template(name="fleetsight_es_doc" type="string" string="%$!%")',
        # The document id, JSON-escaped (a quote in a file name must not break the bulk request's line).
        'template(name="fleetsight_doc_id" type="string" string="%$.id:::json%")',
        'template(name="fleetsight_now" type="string" string="%timegenerated:::date-rfc3339%")',
        "",
    ]
    for log_class in LOG_CLASSES:
        name = log_class.name
        lines += [
            f'input(type="imkafka" topic="{log_class.topic}" broker={brokers_array(options.brokers)}',
            f'      consumergroup="{options.consumer_group}" ruleset="ship_{name}"',
            conf_params(SHIPPER_KAFKA_PARAMS, options.kafka_auth, "      ") + ")",
            f'ruleset(name="ship_{name}" queue.type="LinkedList" queue.filename="ship_{name}"',
            '        queue.size="200000"',
            # Two workers, so that OpenSearch indexes one bulk while it parses the next (one bulk at a
            # time keeps one of its write threads idle); the second starts once a bulk's worth waits.
            '        queue.workerThreads="2" queue.workerThreadMinimumMessages="2000"',
            '        queue.saveOnShutdown="on" queue.maxDiskSpace="2g" queue.dequeueBatchSize="2000") {',
            '  action(type="mmjsonparse" cookie="" useRawMsg="on")',
            '  if $parsesuccess != "OK" then {',
            "    # Not a node record (someone produced a bare line): keep it whole, marked.",
            "    set $!message = $rawmsg;",
            '    set $!tags = "not_a_node_record";',
            "  }",
            *NODE_RECORD_ID,
            f'  action(type="omelasticsearch" name="es_{name}" server="{options.es_host}" '
            f'serverport="{options.es_port}" usehttps="off" esVersion.major="8"',
            f'         searchIndex="{log_class.topic}" pipelineName="{log_class.pipeline_id}"',
            '         template="fleetsight_es_doc" bulkmode="on" maxbytes="10m"',
            '         dynbulkid="on" bulkid="fleetsight_doc_id" writeoperation="index"',
            # A record the server refused in a bulk that otherwise went through (a shard still
            # recovering after a restart, a full write queue) goes to the retry ruleset below.
            f'         retryfailures="on" retryruleset="retry_{name}"',
            f"         errorFile={quote(str(options.error_file))}",
            '         action.resumeRetryCount="-1" action.resumeInterval="2")',
            "}",
            f'ruleset(name="retry_{name}") {{',
            # Transient: 429 and 5xx, and a pipeline that "does not exist" while a restarted server
            # still loads its cluster state: back into the class's queue (its id keeps it idempotent).
            # Anything else (a document the mapping cannot take) stays in the error file.
            "  if $.omes!status == 429 or $.omes!status >= 500 or "
            '($.omes!error!reason contains "does not exist") then {',
            f"    call ship_{name}",
            "  }",
            "}",
            "",
        ]
        if name in CATALOGUES:
            lines += edge_shipper(log_class, options, first=name == next(iter(CATALOGUES)))
    return "\n".join(lines)
