/* FleetSight viewer, the fleet page: one row per cluster (the global layer's GET /v1/clusters, and the
   per-cluster figures of Prometheus/Thanos), a banner naming every cluster the view is missing, and the
   firing alerts with their cluster; redrawn every 15 seconds. */
"use strict";

const FLEET_REFRESH_MS = 15000;
const NO_CLUSTER = "(no cluster label)";

const clusterName = (name) => name || NO_CLUSTER;

/** "Partial view: cluster b is not answering (connect timeout)", one line per cluster and side. */
function drawPartial(partial) {
  const banner = document.getElementById("partial");
  const lines = (partial || []).map((gap) => {
    const what = gap.what === "metrics" ? `the metrics of cluster ${gap.cluster} are` : `cluster ${gap.cluster} is`;
    return el("div", {class: "gap", "data-cluster": gap.cluster, "data-what": gap.what},
      `Partial view: ${what} not answering${gap.error ? ` (${gap.error})` : ""}`);
  });
  banner.replaceChildren(...lines);
  banner.hidden = !lines.length;
}

function statesText(states) {
  const entries = Object.entries(states || {}).filter(([, n]) => n);
  return entries.length ? entries.map(([state, n]) => `${state} ${n}`).join(", ") : "no nodes";
}

function healthCell(c, configured) {
  if (!configured) return el("td", {class: "muted"}, "no global layer");
  if (!c.known_to_layer) return el("td", {class: "muted"}, "not in the global layer's clusters file");
  if (c.answers) {
    const took = c.answer_seconds !== null && c.answer_seconds !== undefined ? ` in ${c.answer_seconds} s` : "";
    return el("td", {class: "answers", "data-answers": "yes"}, `answers${took}${c.role ? ` (${c.role})` : ""}`);
  }
  return el("td", {class: "missing", "data-answers": "no"}, `not answering: ${c.error || "no reason given"}`);
}

function metricsCell(c, metricsSide) {
  if (!c.metrics) return el("td", {class: "muted"}, metricsSide || !c.known_to_layer ? "–" : "not checked (layer without --thanos-url)");
  const m = c.metrics;
  // A store gateway alone serves blocks two hours old and more: the recent data needs a live store.
  const live = m.live_answering ?? m.answering;
  const ok = live > 0;
  const stale = m.answering > 0 && !ok ? " (no live store: only blocks two hours old and more)" : "";
  const text = `${m.answering} of ${m.stores} store${m.stores === 1 ? "" : "s"} answering${stale}`;
  return el("td", {class: ok ? "answers" : "missing", "data-metrics": ok ? "yes" : "no",
    title: (m.errors || []).join("\n")}, text);
}

// A figure the global Query could not give (the cluster's metrics missing, or the query failed) is
// unknown, never 0.
function figureCell(name, value) {
  const known = value !== null && value !== undefined;
  return el("td", {class: known ? "num" : "num muted", [`data-${name}`]: known ? String(value) : "unknown"},
    known ? value : "unknown");
}

function drawClusters(answer) {
  const rows = (answer.clusters || []).map((c) => el("tr", {"data-cluster": c.cluster},
    el("td", {}, el("a", {href: `/d/fleetsight-fleet-health?var-cluster=${encodeURIComponent(c.cluster)}`}, clusterName(c.cluster))),
    healthCell(c, answer.configured),
    el("td", {"data-states": JSON.stringify(c.states || {})}, c.known_to_layer && c.answers ? statesText(c.states) : "–"),
    metricsCell(c, answer.metrics_side),
    figureCell("gpus", c.gpus), figureCell("firing", c.firing)));
  document.querySelector("#clusters tbody").replaceChildren(...rows);
  document.getElementById("clusters").hidden = !rows.length;
  document.getElementById("clusters-none").hidden = rows.length > 0;
}

function drawFleetAlerts(alerts) {
  const rows = (alerts || []).map((a) => {
    const extra = Object.entries(a.labels || {})
      .filter(([k]) => !["alertname", "severity", "node", "alertstate", "cluster", "__name__"].includes(k))
      .map(([k, v]) => `${k}=${v}`).join(" ");
    const node = a.node ? el("a", {href: `/d/fleetsight-node?var-cluster=${encodeURIComponent(a.cluster)}&var-node=${encodeURIComponent(a.node)}`}, a.node) : "";
    return el("tr", {"data-alert": a.alertname, "data-cluster": a.cluster},
      el("td", {}, clusterName(a.cluster)), el("td", {}, a.alertname), el("td", {class: `sev-${a.severity}`}, a.severity || ""),
      el("td", {}, node), el("td", {class: "muted"}, extra));
  });
  document.querySelector("#alerts tbody").replaceChildren(...rows);
  document.getElementById("alerts").hidden = !rows.length;
  document.getElementById("alerts-none").hidden = rows.length > 0;
}

async function refreshFleet() {
  let answer;
  try {
    answer = await api("/api/fleet");
  } catch (error) {
    showPageError(`The fleet page did not load: ${error.message}`);
    return;
  }
  document.getElementById("not-configured").hidden = Boolean(answer.configured);
  drawPartial(answer.partial);
  drawClusters(answer);
  drawFleetAlerts(answer.alerts);
  const errors = answer.errors || [];
  if (errors.length) showPageError(`Part of the fleet page is missing:\n${errors.join("\n")}`);
  else clearPageError();
  const at = answer.at ? new Date(answer.at * 1000) : new Date();
  document.getElementById("updated").textContent = `(updated ${at.toLocaleTimeString()})`;
  document.querySelector("main").dataset.at = String(answer.at || "");
}

refreshFleet();
setInterval(refreshFleet, FLEET_REFRESH_MS);
