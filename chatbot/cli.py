"""``fleetsight chatbot``: serve the chatbot, evaluate it on a question set."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

import click

from fleetsight.webconfig import listen_address, run_server, uvicorn_tls, web_config_option

from .access import ASK, DEFAULT_ASK_TIMEOUT_S, DEFAULT_RATE, RATE_ENV, Access, AccessError
from .answer import FUSIONS, MODES, Answerer
from .config import ConfigError, chat_config
from .evaluate import OUT_OF_SCOPE, Entry, QuestionSetError, Report, evaluate, load_questions

DEFAULT_LISTEN = "127.0.0.1:19142"
DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "eval" / "questions.yaml"

docs_option = click.option(
    "--docs",
    "docs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="A Markdown file or folder to answer from (repeatable); default: docs/runbooks/ and docs/.",
)


@click.group(name="chatbot", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The runbook chatbot: answers from the runbooks and live state, with citations.

    \b
    Examples:
      fleetsight chatbot serve --health-url http://127.0.0.1:19141 --anomaly-url http://127.0.0.1:19140
      fleetsight chatbot evaluate --questions chatbot/eval/questions.yaml
      fleetsight chat "what does Xid 79 mean for my job"
    """


@cli.command()
@click.option(
    "--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT of the API and chat page."
)
@click.option("--health-url", envvar="FLEETSIGHT_HEALTH_URL", help="Health service base URL (node state).")
@click.option("--anomaly-url", envvar="FLEETSIGHT_ANOMALY_URL", help="Anomaly service base URL (stragglers).")
@click.option(
    "--logs-url",
    envvar="FLEETSIGHT_LOGS_URL",
    help="OpenSearch/Elasticsearch URL (recent errors). With security on: FLEETSIGHT_CHATBOT_LOGS_USER, "
    "_LOGS_PASSWORD_FILE (a read-only user) and _LOGS_CA_FILE.",
)
@click.option(
    "--llm-url", help="OpenAI-compatible base URL (…/v1); default $FLEETSIGHT_CHATBOT_LLM_URL, or none."
)
@click.option("--llm-model", help="Model name for the endpoint; default $FLEETSIGHT_CHATBOT_LLM_MODEL.")
@click.option("--llm-timeout", type=float, help="Seconds before falling back to quoting (default 20).")
@click.option("--public-url", help="URL people reach this service at (citation links in Slack).")
@click.option(
    "--slack-signing-secret-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File holding Slack's signing secret (else $FLEETSIGHT_SLACK_SIGNING_SECRET); without: no Slack.",
)
@click.option(
    "--open-reads/--token-reads",
    default=True,
    show_default=True,
    help="GET /v1/status and the cited files without a token (the cluster network), or only with scope read.",
)
@click.option(
    "--open-asks/--token-asks",
    default=False,
    show_default=True,
    help="POST /v1/ask without a token (cluster network; rate-limited per address), or only with scope ask "
    "(FLEETSIGHT_CHATBOT_TOKENS='tok=ask' or FLEETSIGHT_CHATBOT_TOKENS_FILE).",
)
@click.option(
    "--rate-limit",
    help=f"Asks per caller (token, else address; Slack: user) as COUNT/PERIOD, or off; default "
    f"${RATE_ENV} or {DEFAULT_RATE}.",
)
@click.option(
    "--ask-timeout",
    type=float,
    default=DEFAULT_ASK_TIMEOUT_S,
    show_default=True,
    help="Seconds an answer may take (live look-ups and model included) before the caller gets 504.",
)
@docs_option
@web_config_option
def serve(
    listen: str,
    health_url: str | None,
    anomaly_url: str | None,
    logs_url: str | None,
    llm_url: str | None,
    llm_model: str | None,
    llm_timeout: float | None,
    public_url: str | None,
    slack_signing_secret_file: Path | None,
    open_reads: bool,
    open_asks: bool,
    rate_limit: str | None,
    ask_timeout: float,
    docs: tuple[Path, ...],
    web_config_file: str | None = None,
) -> None:
    """Run the service: POST /v1/ask, the chat page at /, Slack at POST /slack/command.

    \b
    Examples:
      fleetsight chatbot serve
      fleetsight chatbot serve --listen 0.0.0.0:8080 --health-url http://health:19141 \\
          --anomaly-url http://anomaly:19140 --logs-url http://opensearch:9200
      FLEETSIGHT_CHATBOT_LLM_KEY=... fleetsight chatbot serve --llm-url http://vllm:8000/v1 --llm-model qwen
      FLEETSIGHT_CHATBOT_TOKENS_FILE=/etc/fleetsight/tokens fleetsight chatbot serve --rate-limit 10/min
      fleetsight chatbot serve --open-asks    # anyone on the cluster network may ask (loopback here)
      fleetsight chatbot serve --listen 0.0.0.0:9442 --web.config.file /etc/fleetsight/web-config.yml
    """
    from . import slack
    from .service import create_app

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="ts=%(asctime)s level=%(levelname)s %(message)s"
    )
    host, port = listen_address(listen)
    try:
        access = Access.from_env(open_reads, open_asks, rate_limit, ask_timeout)
    except AccessError as exc:
        raise click.BadParameter(str(exc)) from None
    tls = uvicorn_tls(web_config_file)
    if not open_asks and not any(ASK in scopes for scopes in access.tokens.values()):
        logging.getLogger("chatbot").warning(
            "event=no_ask_tokens detail=%r",
            "no token with scope ask (FLEETSIGHT_CHATBOT_TOKENS): POST /v1/ask refuses every caller; "
            "Slack still answers. Add tokens, or --open-asks",
        )
    try:
        config = chat_config(docs, health_url, anomaly_url, logs_url, llm_url, llm_model, llm_timeout)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    app = create_app(config, slack.load_signing_secret(slack_signing_secret_file), public_url, access)
    index = app.state.answerer.index
    if not index.sections:
        where = ", ".join(str(p) for p in config.source_paths())
        raise click.ClickException(f"no Markdown sections in {where}: nothing to answer from (see --docs)")
    click.echo(
        f"chatbot: {len({s.file for s in index.sections})} files, {len(index.sections)} sections indexed; "
        f"{'https' if tls else 'http'}://{host}:{port}/ (API docs /docs)",
        err=True,
    )
    run_server(app, host, port, tls, limit_concurrency=64)


@cli.command(name="evaluate")
@click.option(
    "--questions",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_QUESTIONS,
    show_default=True,
    help="YAML list of {question, expect: [docs/runbooks/<Name>.md, ...]}; empty expect = out of scope.",
)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(MODES),
    help="Retrieval mode(s) to score (repeatable); default: all three side by side.",
)
@click.option(
    "--fusion",
    type=click.Choice(FUSIONS),
    default="sum",
    show_default=True,
    help="How hybrid fuses BM25 and the embeddings: calibrated score sum or reciprocal rank fusion.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--show-failures/--no-failures", default=True, show_default=True, help="List the questions missed."
)
@docs_option
def evaluate_command(
    questions: Path,
    modes: tuple[str, ...],
    fusion: str,
    as_json: bool,
    show_failures: bool,
    docs: tuple[Path, ...],
) -> None:
    """Score the chatbot on a question set: hit@1, hit@3, valid citations, out-of-scope declined, for
    lexical (BM25), dense (embeddings) and hybrid retrieval side by side, overall and per category.

    \b
    Examples:
      fleetsight chatbot evaluate
      fleetsight chatbot evaluate --questions chatbot/eval/heldout.yaml --mode hybrid --fusion rrf
      fleetsight chatbot evaluate --questions chatbot/eval/questions.yaml --json
    """
    try:
        entries = load_questions(questions)
    except QuestionSetError as exc:
        raise click.ClickException(str(exc)) from exc
    modes = modes or MODES
    reports = {}
    for mode in modes:
        answerer = Answerer(replace(chat_config(docs), mode=mode, fusion=fusion))
        if not answerer.index.sections:
            raise click.ClickException(
                "no Markdown sections found in the docs: nothing to evaluate (see --docs)"
            )
        reports[mode] = evaluate(answerer, entries)
    main = "hybrid" if "hybrid" in reports else modes[0]
    if as_json:
        out = dict(reports[main].summary())
        out["mode"] = main
        out["fusion"] = fusion
        out["modes"] = {mode: report.summary() for mode, report in reports.items()}
        out["categories"] = {
            mode: {name: part.summary() for name, part in report.by_category().items()}
            for mode, report in reports.items()
        }
        if show_failures:
            out["failures"] = reports[main].failures()
            out["hit_at_1_misses"] = reports[main].first_misses()
        click.echo(json.dumps(out, indent=2))
        return
    print_table(reports, entries, fusion)
    if show_failures:
        click.echo(f"\nmisses of {main}:")
        for failure in reports[main].failures():
            click.echo(
                f"  missed: {failure['question']!r} expect={failure['expect']} cited={failure['cited'][:3]}"
            )
        for miss in reports[main].first_misses():
            click.echo(f"  not first: {miss['question']!r} expect={miss['expect']} cited={miss['cited']}")


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def print_table(reports: dict[str, Report], entries: list[Entry], fusion: str) -> None:
    """Overall figures per mode side by side, then hit@1 / hit@3 (declined for out of scope) per category."""
    modes = list(reports)
    first = next(iter(reports.values())).summary()
    click.echo(
        f"questions: {first['questions']} ({first['in_scope']} in scope, {first['out_of_scope']} out); "
        f"hybrid fusion: {fusion}"
    )
    if first["in_scope_missing_runbooks"]:
        click.echo(f"  not scored (no expected runbook exists yet): {first['in_scope_missing_runbooks']}")
    summaries = {mode: report.summary() for mode, report in reports.items()}
    click.echo(f"{'':24}" + "".join(f"{mode:>10}" for mode in modes))
    for key in ("hit_at_1", "hit_at_3", "citations_valid", "out_of_scope_declined", "answer_ms_p50"):
        cells = [summaries[m][key] for m in modes]
        shown = [f"{c:>10}" if key == "answer_ms_p50" else f"{_cell(c):>10}" for c in cells]
        click.echo(f"{key:24}" + "".join(shown))
    click.echo("\nper category (in scope: hit@1/hit@3; out of scope: declined)")
    names = list(dict.fromkeys(e.category for e in entries))
    for name in names:
        cells = []
        for mode in modes:
            part = reports[mode].by_category()[name].summary()
            if name == OUT_OF_SCOPE:
                cells.append(f"{_cell(part['out_of_scope_declined']):>13}")
            else:
                cells.append(f"{_cell(part['hit_at_1'])}/{_cell(part['hit_at_3'])}".rjust(13))
        count = sum(e.category == name for e in entries)
        click.echo(f"  {name[:30] + f' ({count})':36}" + "".join(cells))
