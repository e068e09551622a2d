/* FleetSight viewer, one dashboard: reads the uid from /d/<uid> and the variables, time range and refresh
   from the query string (Grafana's ?var-node=n0003&from=now-1h&to=now&refresh=30s), lays the panels out on
   Grafana's 24-column grid, and queries every panel through the viewer's API. */
"use strict";

const ALL = "$__all";  // the value Grafana stores for a variable's All option
const RANGES = ["now-15m", "now-1h", "now-6h", "now-24h", "now-7d"];
const REFRESHES = ["", "10s", "30s", "1m"];

const page = {
  uid: decodeURIComponent(location.pathname.replace(/^\/d\//, "").split("/")[0]),
  dashboard: null, from: "now-6h", to: "now", refresh: "", variables: [], chosen: {},
  panels: [], generation: 0, timer: null, inFlight: 0,
};

/* ---- the URL ---- */

function readUrl(dashboard) {
  const params = new URLSearchParams(location.search);
  const time = dashboard.time || {};
  page.from = params.get("from") || time.from || "now-6h";
  page.to = params.get("to") || time.to || "now";
  page.refresh = params.has("refresh") ? params.get("refresh") : dashboard.refresh || "";
  for (const key of new Set([...params.keys()].filter((k) => k.startsWith("var-")))) {
    const values = params.getAll(key);  // Grafana's form of several values: var-cluster=a&var-cluster=b
    page.chosen[key.slice(4)] = values.length === 1 ? values[0] : values;
  }
}

function writeUrl() {
  const params = new URLSearchParams(location.search);
  for (const key of [...params.keys()]) if (key.startsWith("var-")) params.delete(key);
  for (const v of page.variables) {
    if (v.hidden || page.chosen[v.name] === undefined) continue;
    for (const value of [].concat(page.chosen[v.name])) params.append(`var-${v.name}`, value);
  }
  params.set("from", page.from);
  params.set("to", page.to);
  if (page.refresh) params.set("refresh", page.refresh);
  else params.delete("refresh");
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

/* ---- variables ---- */

/** The values a query sends: each shown variable's choice (constants are the server's to fill in). */
function chosenValues() {
  const values = {};
  for (const v of page.variables) if (!v.hidden && page.chosen[v.name] !== undefined) values[v.name] = page.chosen[v.name];
  return values;
}

/** Text with $name, ${name} and [[name]] replaced by the variables' values (URL-encoded for links). */
function interpolate(text, encode) {
  const values = {};
  for (const v of page.variables) {
    const chosen = [].concat(page.chosen[v.name] ?? (v.options || [])[0] ?? "");
    values[v.name] = chosen[0] === ALL ? (v.options || []).join(",") : chosen.join(",");
  }
  const value = (name, whole) => (name in values ? (encode ? encodeURIComponent(values[name]) : values[name]) : whole);
  return String(text)
    .replace(/\$\{(\w+)(?::\w+)?\}/g, (whole, name) => value(name, whole))
    .replace(/\[\[(\w+)\]\]/g, (whole, name) => value(name, whole))
    .replace(/\$(\w+)/g, (whole, name) => value(name, whole));
}

/** The choice a variable's control shows: the page's, else the variable's own default (All), else the
    first option; with `reset`, a choice no longer among the options (a node of another cluster) too. */
function currentChoice(v, reset) {
  const options = v.options || [];
  const chosen = page.chosen[v.name];
  const listed = (value) => value === ALL ? v.includeAll : options.includes(value);
  if (chosen !== undefined && (!reset || [].concat(chosen).every(listed))) return chosen;
  if (v.default) return v.default;
  return options.length ? options[0] : undefined;
}

function variableControl(v, reset) {
  const options = v.options || [];
  const problem = v.error ? `error: ${v.error}` : options.length || v.includeAll ? "" : "no values in this range";
  page.chosen[v.name] = currentChoice(v, reset);
  const current = [].concat(page.chosen[v.name] ?? []);
  const unlisted = current.filter((c) => c !== ALL && !options.includes(c));
  const values = [...(v.includeAll ? [ALL] : []), ...unlisted, ...options];
  const label = (o) => (o === ALL ? "All" : o);
  const select = el("select", {id: `var-${v.name}`, name: v.name, disabled: !values.length, multiple: v.multi,
    size: v.multi ? String(Math.min(Math.max(values.length, 2), 5)) : undefined},
  values.length ? values.map((o) => el("option", {value: o, selected: current.includes(o)}, label(o))) : el("option", {}, "(none)"));
  select.addEventListener("change", () => {
    page.chosen[v.name] = v.multi ? multiChoice(select, current) : select.value;
    writeUrl();
    // The other variables' options may depend on this one (the nodes of the chosen clusters).
    reloadVariablesThenQuery(true);
  });
  return el("label", {class: `variable${problem ? (v.error ? " error" : " empty") : ""}`, "data-variable": v.name},
    v.label || v.name, select, problem ? el("span", {class: "var-problem"}, problem) : null);
}

/** A multi-select's new choice: All alone when All was just picked, else the values picked (All when none). */
function multiChoice(select, before) {
  const picked = [...select.selectedOptions].map((o) => o.value);
  if (picked.includes(ALL) && !before.includes(ALL)) return ALL;
  const values = picked.filter((o) => o !== ALL);
  if (!values.length) return picked.includes(ALL) ? ALL : before;
  return values.length === 1 ? values[0] : values;
}

async function loadVariables(reset = false) {
  const query = new URLSearchParams({from: page.from, to: page.to});
  for (const [name, value] of Object.entries(page.chosen)) for (const one of [].concat(value)) query.append(`var-${name}`, one);
  const answer = await api(`/api/dashboards/${encodeURIComponent(page.uid)}/variables?${query}`);
  page.variables = answer.variables || [];
  document.getElementById("variables").replaceChildren(...page.variables.filter((v) => !v.hidden).map((v) => variableControl(v, reset)));
}

/* ---- time range and refresh ---- */

function fillPicker(select, values, current, label) {
  const listed = values.includes(current) ? values : [...values, current];
  select.replaceChildren(...listed.map((v) => el("option", {value: v, selected: v === current}, label(v))));
}

function setupPickers() {
  const range = document.getElementById("range");
  const currentRange = page.to === "now" ? page.from : `${page.from}|${page.to}`;
  fillPicker(range, RANGES, currentRange, (v) => rangeLabel(...(v.includes("|") ? v.split("|") : [v, "now"])));
  range.addEventListener("change", async () => {
    [page.from, page.to] = range.value.includes("|") ? range.value.split("|") : [range.value, "now"];
    writeUrl();
    await reloadVariablesThenQuery();
  });
  const refresh = document.getElementById("refresh");
  fillPicker(refresh, REFRESHES, page.refresh, (v) => v || "Off");
  refresh.addEventListener("change", () => {
    page.refresh = refresh.value;
    writeUrl();
    schedule();
  });
  document.getElementById("reload").addEventListener("click", () => queryAll(true));
}

function refreshSeconds(word) {
  const match = /^(\d+)(s|m|h)$/.exec(word || "");
  return match ? Number(match[1]) * {s: 1, m: 60, h: 3600}[match[2]] : 0;
}

function schedule() {
  clearInterval(page.timer);
  const every = refreshSeconds(page.refresh);
  if (every) page.timer = setInterval(() => { if (!page.inFlight) queryAll(false); }, every * 1000);
}

async function reloadVariablesThenQuery(reset = false) {
  forgetStates();
  try {
    await loadVariables(reset);
    clearPageError();
  } catch (error) {
    showPageError(`The variables did not load: ${error.message}`);
  }
  writeUrl();
  queryAll();
}

/* ---- layout: rows and the grid ---- */

/** Sections of the dashboard: panels before the first row, then each row with the panels under it
    (a collapsed row keeps its panels in `panels`). */
function sectionsOf(panels) {
  const sorted = [...panels].sort((a, b) => (a.gridPos?.y ?? 0) - (b.gridPos?.y ?? 0) || (a.gridPos?.x ?? 0) - (b.gridPos?.x ?? 0));
  const sections = [{row: null, panels: []}];
  for (const panel of sorted) {
    if (panel.type === "row") sections.push({row: panel, panels: [...(panel.collapsed ? panel.panels || [] : [])]});
    else sections[sections.length - 1].panels.push(panel);
  }
  return sections.filter((s) => s.row || s.panels.length);
}

function panelElement(panel, top) {
  const pos = panel.gridPos || {x: 0, y: top, w: 12, h: 8};
  const title = interpolate(panel.title || "");
  const info = panel.description ? el("span", {class: "info", title: panel.description, "aria-label": panel.description}, "i") : null;
  const node = el("section", {class: "panel", "data-panel-title": panel.title || "", "data-type": panel.type,
    "data-viewer-key": panel.viewerKey,
    style: {"--h": String(pos.h ?? 8), gridColumn: `${(pos.x ?? 0) + 1} / span ${pos.w ?? 12}`, gridRow: `${(pos.y ?? 0) - top + 1} / span ${pos.h ?? 8}`}},
  el("header", {class: "panel-header"}, el("span", {class: "title", title}, title), info, el("span", {class: "loading"})),
  el("div", {class: "panel-body"}));
  page.panels.push({panel, node});
  return node;
}

function sectionElement(section) {
  const top = Math.min(...section.panels.map((p) => p.gridPos?.y ?? 0));
  const grid = el("div", {class: "grid"}, section.panels.map((p) => panelElement(p, top)));
  if (!section.row) return [grid];
  const expanded = !section.row.collapsed;
  grid.hidden = !expanded;
  const header = el("button", {type: "button", class: "row-header", "aria-expanded": String(expanded), "data-row-title": section.row.title || ""},
    el("span", {class: "chevron"}, "▾"), interpolate(section.row.title || ""),
    el("span", {class: "row-count"}, `(${section.panels.length} panel${section.panels.length === 1 ? "" : "s"})`));
  header.addEventListener("click", () => toggleRow(header, grid));
  return [header, grid];
}

function toggleRow(header, grid) {
  const expand = grid.hidden;
  grid.hidden = !expand;
  header.setAttribute("aria-expanded", String(expand));
  if (!expand) return;
  for (const {panel, node} of page.panels) {
    if (node._pending && grid.contains(node)) {
      drawAnswer(node, panel, node._pending, drawContext());
      node._pending = null;
    }
  }
  resizeCharts(grid);
}

/* ---- queries ---- */

/** What a drawer needs from the page: the variables for links, and the range's ends for the time axes. */
function drawContext() {
  const now = Date.now();
  const range = [instantOf(page.from, now), instantOf(page.to, now)];
  return {interpolate, range: range.every(Number.isFinite) && range[0] < range[1] ? range : null};
}

async function queryPanel(panel, node, generation) {
  const loading = node.querySelector(".loading");
  loading.textContent = "loading…";
  node.setAttribute("aria-busy", "true");
  let answer;
  try {
    answer = await api(`/api/dashboards/${encodeURIComponent(page.uid)}/query`,
      {panel: panel.viewerKey, vars: chosenValues(), from: page.from, to: page.to});
  } catch (error) {
    answer = {failure: `the query did not answer: ${error.message}`};
  }
  if (generation !== page.generation) return;  // a newer choice has been queried since
  loading.textContent = "";
  node.removeAttribute("aria-busy");
  if (node.offsetParent === null) {  // in a collapsed row: mark its state now, draw it when shown
    markState(node, panel, answer);
    node._pending = answer;
    return;
  }
  drawAnswer(node, panel, answer, drawContext());
}

/** Queries every panel. After a new choice (variable, range, Reload) a panel loses its data-state until
    its new answer is drawn, so nothing reads the old choice's state as the new one's; the timer's
    refresh keeps it (the same choice, newer numbers). */
function forgetStates() {
  for (const {node} of page.panels) for (const key of ["state", "frames", "names", "sum"]) delete node.dataset[key];
}

async function queryAll(newChoice = true) {
  const generation = ++page.generation;
  if (newChoice) forgetStates();
  page.inFlight += 1;
  try {
    await Promise.all(page.panels.map(({panel, node}) => queryPanel(panel, node, generation)));
  } finally {
    page.inFlight -= 1;
  }
}

/* ---- the page ---- */

async function start() {
  const main = document.getElementById("panels");
  let answer;
  try {
    answer = await api(`/api/dashboards/${encodeURIComponent(page.uid)}`);
  } catch (error) {
    document.getElementById("title").textContent = "Dashboard not found";
    showPageError(`Dashboard ${page.uid} did not load: ${error.message}`);
    main.removeAttribute("aria-busy");
    return;
  }
  const dashboard = answer.dashboard;
  page.dashboard = dashboard;
  readUrl(dashboard);
  document.getElementById("title").textContent = dashboard.title || page.uid;
  document.title = `${dashboard.title || page.uid} · FleetSight`;
  document.getElementById("question").textContent = [answer.persona, answer.question].filter(Boolean).join(": ");
  setupPickers();
  try {
    await loadVariables();
  } catch (error) {
    showPageError(`The variables did not load: ${error.message}`);
  }
  writeUrl();
  main.replaceChildren(...sectionsOf(dashboard.panels || []).flatMap(sectionElement));
  main.removeAttribute("aria-busy");
  window.addEventListener("resize", () => resizeCharts(main));
  await queryAll();
  schedule();
}

start();
