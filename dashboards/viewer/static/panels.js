/* FleetSight viewer: draws one Grafana panel from the server's frames. Each panel type the shipped
   dashboards use has a drawer here: timeseries, stat, table, status-history, heatmap and bargauge. */
"use strict";

const PALETTE = ["#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#FADE2A",
  "#37872D", "#FF9830", "#C4162A", "#1F60C4", "#8F3BB8", "#E0B400", "#96D98D", "#FFB357"];
/* Without thresholds or mappings a status value has no good or bad: distinct hues, named in the legend. */
const STATUS_PALETTE = ["#5794F2", "#FF9830", "#B877D9", "#FADE2A", "#73BF69", "#F2495C", "#8AB8FF", "#FFB357"];
const BINARY = {0: "#FF9830", 1: "#5794F2"};
const TEXT = "#d8d9da";
const MUTED = "#8e95a3";
const GRIDLINE = "#2c3038";

/* Grafana's colour names (thresholds and mappings use them); a CSS colour passes through. */
const NAMED = {green: "#73BF69", red: "#F2495C", yellow: "#FADE2A", orange: "#FF9830", blue: "#5794F2",
  purple: "#B877D9", text: TEXT, transparent: "transparent"};

function colourOf(name) {
  if (!name) return undefined;
  const base = name.replace(/^(super-light|light|semi-dark|dark)-/, "");
  return NAMED[name] || NAMED[base] || name;
}

/** What the panel's fieldConfig says about its values (only the defaults: no panel sets overrides). */
function fieldOptions(panel) {
  const d = (panel.fieldConfig && panel.fieldConfig.defaults) || {};
  return {unit: d.unit, decimals: d.decimals, min: d.min, max: d.max, links: d.links || [],
    thresholds: d.thresholds, mappings: d.mappings || []};
}

/** A value mapping's {text, color} for `value`, or null (Grafana's value, range and special kinds). */
function mapped(value, mappings) {
  for (const m of mappings) {
    const o = m.options || {};
    if (m.type === "value" && value !== null && o[String(value)]) return o[String(value)];
    if (m.type === "range" && value !== null && (o.from === null || o.from === undefined || value >= o.from) &&
        (o.to === null || o.to === undefined || value <= o.to)) return o.result;
    if (m.type === "special" && value === null && (o.match === "null" || o.match === "null+nan")) return o.result;
  }
  return null;
}

/** The colour of the highest threshold step at or below `value`, or undefined without thresholds. */
function thresholdColour(value, thresholds) {
  if (!thresholds || !thresholds.steps || !thresholds.steps.length || value === null) return undefined;
  let colour;
  for (const step of thresholds.steps) if (step.value === null || step.value === undefined || value >= step.value) colour = step.color;
  return colourOf(colour);
}

/** {text, colour} of one value: a mapping first, then the unit and the thresholds. */
function display(value, opts) {
  const hit = mapped(value, opts.mappings);
  if (hit) return {text: hit.text ?? formatValue(value, opts.unit, opts.decimals), colour: colourOf(hit.color)};
  return {text: formatValue(value, opts.unit, opts.decimals), colour: thresholdColour(value, opts.thresholds)};
}

function lastValue(frame) {
  for (let i = frame.points.length - 1; i >= 0; i--) if (frame.points[i][1] !== null) return frame.points[i][1];
  return null;
}

function frameName(frame) {
  if (frame.name) return frame.name;
  const labels = Object.entries(frame.labels || {}).map(([k, v]) => `${k}="${v}"`).join(", ");
  return labels ? `{${labels}}` : frame.refId || "value";
}

/* ---- ECharts panels ---- */

function chartOf(host) {
  if (!host._chartDiv) host._chartDiv = el("div", {class: "chart"});
  host.append(host._chartDiv);
  if (!host._chart) host._chart = echarts.init(host._chartDiv, null, {renderer: "canvas"});
  return host._chart;
}

function axisStyle() {
  return {axisLine: {lineStyle: {color: GRIDLINE}}, axisLabel: {color: MUTED, fontSize: 11, hideOverlap: true},
    splitLine: {lineStyle: {color: GRIDLINE}}};
}

function drawTimeseries(host, panel, frames, ctx) {
  const opts = fieldOptions(panel);
  const fmt = (v) => formatValue(v, opts.unit, opts.decimals);
  const legend = frames.length > 1 || frames[0].name;
  chartOf(host).setOption({
    animation: false, color: PALETTE, backgroundColor: "transparent",
    grid: {left: 8, right: 16, top: 10, bottom: legend ? 34 : 8, containLabel: true},
    tooltip: {trigger: "axis", valueFormatter: fmt, confine: true, backgroundColor: "#22252b",
      borderColor: GRIDLINE, textStyle: {color: TEXT, fontSize: 12}},
    legend: legend ? {type: "scroll", bottom: 0, textStyle: {color: TEXT, fontSize: 11}, pageTextStyle: {color: MUTED},
      itemHeight: 8, itemWidth: 14} : {show: false},
    xAxis: {type: "time", min: ctx.range?.[0], max: ctx.range?.[1], ...axisStyle(), splitLine: {show: false}},
    yAxis: {type: "value", min: opts.min, max: opts.max, ...axisStyle(), axisLabel: {color: MUTED, fontSize: 11, hideOverlap: true, formatter: fmt}},
    series: frames.map((f) => ({name: frameName(f), type: "line", showSymbol: f.points.length < 3, symbolSize: 4,
      data: f.points, lineStyle: {width: 1.5}, emphasis: {focus: "series"}})),
  }, true);
}

/** Short time labels: the clock, with the date when the span is over a day. */
function clockLabel(span) {
  return (t) => {
    const d = new Date(t);
    const clock = d.toTimeString().slice(0, 5);
    return span > 86400000 ? `${String(d.getMonth() + 1).padStart(2, "0")}-${String(d.getDate()).padStart(2, "0")} ${clock}` : clock;
  };
}

function smallestStep(times) {
  let step = Infinity;
  for (let i = 1; i < times.length; i++) step = Math.min(step, times[i] - times[i - 1]);
  return step;
}

/** The heatmap's columns: the data's times, extended by its step to fill the chosen range. */
function heatmapColumns(frames, range) {
  const times = [...new Set(frames.flatMap((f) => f.points.map((p) => p[0])))].sort((a, b) => a - b);
  const step = smallestStep(times);
  if (!range || !Number.isFinite(step) || (range[1] - range[0]) / step > 2000) return times;
  const before = [], after = [];
  for (let t = times[0] - step; t >= range[0]; t -= step) before.unshift(t);
  for (let t = times[times.length - 1] + step; t <= range[1]; t += step) after.push(t);
  return [...before, ...times, ...after];
}

function drawHeatmap(host, panel, frames, ctx) {
  const opts = fieldOptions(panel);
  const fmt = (v) => formatValue(v, opts.unit, opts.decimals);
  const times = heatmapColumns(frames, ctx.range);
  const column = new Map(times.map((t, i) => [t, i]));
  const data = [];
  let low = Infinity, high = -Infinity;
  frames.forEach((f, row) => f.points.forEach(([t, v]) => {
    if (v === null) return;
    data.push([column.get(t), row, v]);
    low = Math.min(low, v);
    high = Math.max(high, v);
  }));
  if (!data.length) low = high = 0;
  const clock = clockLabel(times[times.length - 1] - times[0]);
  chartOf(host).setOption({
    animation: false, backgroundColor: "transparent",
    grid: {left: 8, right: 70, top: 8, bottom: 8, containLabel: true},
    tooltip: {confine: true, backgroundColor: "#22252b", borderColor: GRIDLINE, textStyle: {color: TEXT, fontSize: 12},
      formatter: (p) => `${frameName(frames[p.value[1]])}<br>${new Date(times[p.value[0]]).toLocaleString()}<br><b>${fmt(p.value[2])}</b>`},
    xAxis: {type: "category", data: times.map(clock), ...axisStyle(), splitLine: {show: false}},
    yAxis: {type: "category", inverse: true, data: frames.map(frameName), ...axisStyle(), splitLine: {show: false}},
    visualMap: {type: "continuous", min: opts.min ?? low, max: opts.max ?? (high > low ? high : low + 1),
      orient: "vertical", right: 0, top: "middle", itemHeight: 120, itemWidth: 10, calculable: false,
      textStyle: {color: MUTED, fontSize: 10}, formatter: fmt,
      inRange: {color: ["#1a2340", "#1f60c4", "#5794f2", "#96d98d", "#fade2a", "#ff780a", "#f2495c"]}},
    series: [{type: "heatmap", data, progressive: 0}],
  }, true);
}

/* ---- HTML panels ---- */

function drawStat(host, panel, frames) {
  const opts = fieldOptions(panel);
  const size = frames.length <= 2 ? 44 : frames.length <= 6 ? 28 : 20;
  const boxes = frames.map((f) => {
    const shown = display(lastValue(f), opts);
    return el("div", {class: "stat", "data-name": frameName(f)},
      el("div", {class: "value", style: {fontSize: size + "px", color: shown.colour || TEXT}}, shown.text),
      frames.length > 1 ? el("div", {class: "name", title: frameName(f)}, frameName(f)) : null);
  });
  host.append(el("div", {class: "stats"}, boxes));
}

function drawBargauge(host, panel, frames) {
  const opts = fieldOptions(panel);
  const values = frames.map(lastValue);
  const present = values.filter((v) => v !== null);
  const low = opts.min ?? Math.min(0, ...present);
  const high = opts.max ?? Math.max(low + 1e-9, ...present);
  const rows = frames.map((f, i) => {
    const shown = display(values[i], opts);
    const share = values[i] === null ? 0 : Math.max(0, Math.min(1, (values[i] - low) / (high - low)));
    const colour = shown.colour || PALETTE[0];
    return el("div", {class: "bar-row", "data-name": frameName(f)},
      el("span", {class: "name", title: frameName(f)}, frameName(f)),
      el("div", {class: "bar-track"}, el("div", {class: "bar-fill", style: {width: (share * 100).toFixed(1) + "%", background: colour}})),
      el("span", {class: "value", style: {color: colour}}, shown.text));
  });
  host.append(el("div", {class: "bars"}, rows));
}

/** A link URL with `${__data.fields.<label>}` from the row's labels and the dashboard's variables. */
function rowLink(template, labels, ctx) {
  const fields = template.replace(/\$\{__data\.fields(?:\.([\w.]+)|\["([^"]+)"\])\}/g,
    (_, plain, quoted) => encodeURIComponent(labels[plain || quoted] ?? ""));
  return ctx.interpolate(fields, true);
}

function drawTable(host, panel, frames, ctx) {
  const opts = fieldOptions(panel);
  const columns = [...new Set(frames.flatMap((f) => Object.keys(f.labels || {})))].sort();
  const refs = new Set(frames.map((f) => f.refId));
  const link = opts.links.find((l) => l.url);
  const head = el("tr", {}, refs.size > 1 ? el("th", {}, "Query") : null, columns.map((c) => el("th", {}, c)),
    el("th", {class: "num"}, "Value"), link ? el("th", {}, "") : null);
  const rows = frames.map((f) => {
    const labels = f.labels || {};
    const shown = display(lastValue(f), opts);
    const href = link ? rowLink(link.url, labels, ctx) : null;
    const target = link && link.targetBlank ? "_blank" : null;
    const row = el("tr", {class: href ? "linked" : null, "data-href": href},
      refs.size > 1 ? el("td", {}, f.refId) : null,
      columns.map((c) => el("td", {}, labels[c] ?? "")),
      el("td", {class: "num", style: {color: shown.colour}}, shown.text),
      href ? el("td", {}, el("a", {href, target, rel: target ? "noopener" : null}, link.title || "Open")) : null);
    if (href) row.addEventListener("click", (event) => {
      if (event.target.closest("a")) return;
      if (target) window.open(href, "_blank", "noopener");
      else location.href = href;
    });
    return row;
  });
  host.append(el("table", {class: "data"}, el("thead", {}, head), el("tbody", {}, rows)));
}

/** Runs of one value along a frame: [start, end, value], a gap longer than the step left empty. */
function runsOf(points, step, end) {
  const runs = [];
  points.forEach(([t, v], i) => {
    const next = i + 1 < points.length ? points[i + 1][0] : end;
    const stop = Math.min(next, t + step);
    const last = runs[runs.length - 1];
    if (last && last[2] === v && last[1] === t) last[1] = stop;
    else runs.push([t, stop, v]);
  });
  return runs;
}

function drawStatusHistory(host, panel, frames, ctx) {
  const opts = fieldOptions(panel);
  const times = [...new Set(frames.flatMap((f) => f.points.map((p) => p[0])))].sort((a, b) => a - b);
  let step = smallestStep(times);
  if (!Number.isFinite(step)) step = 60000;
  // The lanes span the chosen range, so a series that began late or stopped early shows it.
  const start = Math.min(ctx.range?.[0] ?? Infinity, times[0]);
  const end = Math.max(ctx.range?.[1] ?? -Infinity, times[times.length - 1] + step);
  const distinct = [...new Set(frames.flatMap((f) => f.points.map((p) => p[1])).filter((v) => v !== null))]
    .sort((a, b) => a - b);
  const binary = distinct.every((v) => v === 0 || v === 1);
  const fallback = (v, i) => (binary ? BINARY[v] : STATUS_PALETTE[i % STATUS_PALETTE.length]);
  const colours = new Map(distinct.map((v, i) => [v, display(v, opts).colour || fallback(v, i)]));
  const lanes = frames.map((f) => {
    const cells = [];
    let at = start;
    for (const [from, to, value] of runsOf(f.points, step, end)) {
      if (from > at) cells.push(el("div", {class: "cell", style: {flexGrow: from - at}}));
      const text = display(value, opts).text;
      cells.push(el("div", {class: "cell", "data-value": value, title: `${frameName(f)}: ${text}\n${new Date(from).toLocaleString()} – ${new Date(to).toLocaleTimeString()}`,
        style: {flexGrow: to - from, background: value === null ? "transparent" : colours.get(value)}}));
      at = to;
    }
    if (end > at) cells.push(el("div", {class: "cell", style: {flexGrow: end - at}}));
    return el("div", {class: "lane", "data-name": frameName(f)},
      el("span", {class: "name", title: frameName(f)}, frameName(f)), el("div", {class: "cells"}, cells));
  });
  const clock = clockLabel(end - start);
  const legend = distinct.slice(0, 16).map((v) => el("span", {style: {"--swatch": colours.get(v)}}, display(v, opts).text));
  host.append(el("div", {class: "lanes"}, lanes,
    el("div", {class: "time-axis"}, el("span", {}, clock(start)), el("span", {}, clock((start + end) / 2)), el("span", {}, clock(end))),
    el("div", {class: "status-legend"}, legend)));
}

const DRAWERS = {timeseries: drawTimeseries, stat: drawStat, table: drawTable, "status-history": drawStatusHistory,
  heatmap: drawHeatmap, bargauge: drawBargauge};
const CHARTED = new Set(["timeseries", "heatmap"]);

/** The state an answer puts a panel in: error (a query failed, or the API did), unavailable (its
    datasource is not configured here: a logs panel without --logs), nodata, or data. */
function stateOf(panel, answer) {
  if (answer.failure) return {state: "error", errors: [answer.failure], frames: [], notes: []};
  const errors = (answer.queries || []).filter((q) => q.error).map((q) => `${q.refId}: ${q.error}`);
  const notes = [...new Set((answer.queries || []).filter((q) => q.unavailable).map((q) => q.unavailable))];
  if (!DRAWERS[panel.type]) errors.push(`panel type "${panel.type}" is not drawn by this viewer`);
  const frames = answer.frames || [];
  const queries = answer.queries || [];
  const unavailable = queries.length > 0 && queries.every((q) => q.unavailable);
  const state = errors.length ? "error" : frames.length ? "data" : unavailable ? "unavailable" : "nodata";
  return {state, errors, frames, notes};
}

/** Marks the panel with what it shows, for tests and scripts: data-state (data, nodata, unavailable or error),
    data-frames (how many), data-names (the frames' names, "|"-joined) and data-sum (of every value). */
function markState(panelEl, panel, answer) {
  const found = stateOf(panel, answer);
  let sum = 0;
  for (const f of found.frames) for (const [, v] of f.points) if (v !== null) sum += v;
  Object.assign(panelEl.dataset, {state: found.state, frames: String(found.frames.length),
    names: found.frames.map(frameName).join("|"), sum: String(sum)});
  return found;
}

/** Draws `answer` into the panel's body (errors first, then the frames) and marks the panel's state. */
function drawAnswer(panelEl, panel, answer, ctx) {
  const host = panelEl.querySelector(".panel-body");
  const {errors, frames} = markState(panelEl, panel, answer);
  panelEl.classList.toggle("panel-with-error", errors.length > 0 && frames.length > 0);
  host.replaceChildren();
  if (errors.length) host.append(el("div", {class: "panel-error", role: "alert"}, errors.join("\n")));
  const keepChart = frames.length && CHARTED.has(panel.type);
  if (!keepChart && host._chart) {
    host._chart.dispose();
    host._chart = null;
  }
  if (!frames.length) {
    const {notes} = stateOf(panel, answer);
    if (!errors.length) host.append(el("div", {class: "panel-nodata"}, notes.length ? `Not shown: ${notes.join("; ")}` : "No data"));
    return;
  }
  if (DRAWERS[panel.type]) DRAWERS[panel.type](host, panel, frames, ctx);
}

function resizeCharts(root) {
  for (const body of root.querySelectorAll(".panel-body")) if (body._chart) body._chart.resize();
}
