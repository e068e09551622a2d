/* FleetSight viewer, fleet overview: every node coloured by its health state and grouped by rack, the
   firing alerts, and the jobs with a straggler now; redrawn every 15 seconds. */
"use strict";

const REFRESH_MS = 15000;
const STATE_ORDER = ["healthy", "suspect", "degraded", "failed", "drained"];
const STATE_COLOURS = {healthy: "#73BF69", suspect: "#FADE2A", degraded: "#FF9830", failed: "#F2495C",
  drained: "#8AB8FF"};
const UNKNOWN_COLOUR = "#8e95a3";

const stateColour = (state) => STATE_COLOURS[state] || UNKNOWN_COLOUR;

function byRack(nodes) {
  const racks = new Map();
  for (const n of nodes) {
    const rack = n.rack || "-";
    if (!racks.has(rack)) racks.set(rack, []);
    racks.get(rack).push(n);
  }
  return [...racks].sort(([a], [b]) => (a === "-") - (b === "-") || a.localeCompare(b, "en", {numeric: true}));
}

function drawCounts(nodes) {
  const counts = new Map(STATE_ORDER.map((s) => [s, 0]));
  for (const n of nodes) counts.set(n.state, (counts.get(n.state) || 0) + 1);
  const boxes = [el("div", {class: "count", "data-state": "total", style: {"--swatch": "#5794F2"}},
    el("div", {class: "n"}, nodes.length), el("div", {class: "label"}, "nodes"))];
  for (const [state, n] of counts) {
    boxes.push(el("div", {class: "count", "data-state": state, style: {"--swatch": stateColour(state)}},
      el("div", {class: "n"}, n), el("div", {class: "label"}, state)));
  }
  document.getElementById("counts").replaceChildren(...boxes);
  document.getElementById("legend").replaceChildren(...[...counts.keys()].map((s) =>
    el("span", {style: {"--swatch": stateColour(s)}}, s)));
}

function drawNodes(nodes, nodeLink) {
  const racks = byRack(nodes).map(([rack, members]) => el("div", {class: "rack", "data-rack": rack},
    el("h3", {}, rack === "-" ? "Rack unknown" : `Rack ${rack}`),
    el("div", {class: "nodes"}, members.map((n) => el("a", {class: "node", href: nodeLink + encodeURIComponent(n.node),
      "data-node": n.node, "data-state": n.state, title: `${n.node}: ${n.state}`, style: {"--swatch": stateColour(n.state)}},
    n.node)))));
  document.getElementById("nodes").replaceChildren(...racks);
}

function fillTable(id, rows) {
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
  document.getElementById(id).hidden = !rows.length;
  document.getElementById(`${id}-none`).hidden = rows.length > 0;
}

function drawAlerts(alerts, nodeLink) {
  fillTable("alerts", alerts.map((a) => {
    const extra = Object.entries(a.labels || {}).filter(([k]) => !["alertname", "severity", "node", "alertstate", "__name__"].includes(k))
      .map(([k, v]) => `${k}=${v}`).join(" ");
    return el("tr", {"data-alert": a.alertname, "data-alert-state": a.state || ""},
      el("td", {}, a.alertname), el("td", {class: `sev-${a.severity}`}, a.severity || ""),
      el("td", {}, a.node ? el("a", {href: nodeLink + encodeURIComponent(a.node)}, a.node) : ""),
      el("td", {class: `state-${a.state}`}, a.state || ""), el("td", {class: "muted"}, extra));
  }));
}

function drawStragglers(stragglers, links) {
  fillTable("stragglers", stragglers.map((s) => el("tr", {"data-job": s.hpc_job},
    el("td", {}, el("a", {href: links.job + encodeURIComponent(s.hpc_job)}, s.hpc_job)),
    el("td", {}, el("a", {href: links.node + encodeURIComponent(s.node)}, s.node)),
    el("td", {}, s.cause || ""))));
}

async function refreshOverview() {
  let answer;
  try {
    answer = await api("/api/overview");
  } catch (error) {
    showPageError(`The overview did not load: ${error.message}`);
    return;
  }
  const links = answer.links || {};
  links.node = links.node || "/d/fleetsight-node?var-node=";
  links.job = links.job || "/d/fleetsight-my-job?var-hpc_job=";
  drawCounts(answer.nodes || []);
  drawNodes(answer.nodes || [], links.node);
  drawAlerts(answer.alerts || [], links.node);
  drawStragglers(answer.stragglers || [], links);
  const chat = document.getElementById("chat-link");
  chat.hidden = !links.chat;
  if (links.chat) chat.href = links.chat;
  const errors = answer.errors || [];
  if (errors.length) showPageError(`Part of the overview is missing:\n${errors.join("\n")}`);
  else clearPageError();
  const at = answer.at ? new Date(answer.at * 1000) : new Date();
  document.getElementById("updated").textContent = `(updated ${at.toLocaleTimeString()})`;
  document.getElementById("nodes").dataset.at = String(answer.at || "");
}

refreshOverview();
setInterval(refreshOverview, REFRESH_MS);
