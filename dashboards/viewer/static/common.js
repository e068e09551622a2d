/* FleetSight dashboard viewer: helpers every page shares (DOM building, the JSON API, Grafana's units). */
"use strict";

/** An element with attributes, properties and children: el("a", {href: "/"}, "home"). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style" && typeof value === "object") {
      for (const [name, rule] of Object.entries(value)) {
        if (rule === undefined || rule === null) continue;
        if (name.startsWith("--")) node.style.setProperty(name, rule);
        else node.style[name] = rule;
      }
    }
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** The API's JSON; a non-2xx answer throws its `detail` (FastAPI's error body) or its status line. */
async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  let answer = null;
  try {
    answer = await response.json();
  } catch (_) {
    answer = null;
  }
  if (!response.ok) {
    const detail = answer && answer.detail;
    const text = typeof detail === "string" ? detail : detail ? JSON.stringify(detail) : "";
    throw new Error(`${response.status} ${response.statusText}${text ? ": " + text : ""}`);
  }
  return answer;
}

/* ---- numbers and Grafana's units ---- */

/** Sensible rounding: whole numbers stay whole, others keep about three significant digits. */
function roundNumber(value, decimals) {
  if (decimals !== undefined && decimals !== null) return value.toFixed(decimals);
  if (Number.isInteger(value)) return String(value);
  const size = Math.abs(value);
  if (size >= 100) return value.toFixed(0);
  if (size >= 10) return value.toFixed(1);
  if (size >= 1) return value.toFixed(2);
  if (size === 0) return "0";
  return String(Number(value.toPrecision(3)));
}

/** The value scaled to the largest step of `steps` ([factor, suffix], ascending) that keeps it >= 1. */
function scaled(value, steps, decimals) {
  let chosen = steps[0];
  for (const step of steps) if (Math.abs(value) >= step[0]) chosen = step;
  return roundNumber(value / chosen[0], decimals) + chosen[1];
}

const SI = (base) => [[1, " " + base], [1e3, " k" + base], [1e6, " M" + base], [1e9, " G" + base], [1e12, " T" + base]];
const DURATION_MS = [[1e-3, " µs"], [1, " ms"], [1e3, " s"], [6e4, " min"], [3.6e6, " h"], [8.64e7, " d"]];

const UNITS = {
  percentunit: (v, d) => roundNumber(v * 100, d) + "%",
  percent: (v, d) => roundNumber(v, d) + "%",
  watt: (v, d) => scaled(v, SI("W"), d),
  Bps: (v, d) => scaled(v, SI("B/s"), d),
  bytes: (v, d) => scaled(v, [[1, " B"], [1024, " KiB"], [1048576, " MiB"], [1073741824, " GiB"]], d),
  h: (v, d) => roundNumber(v, d) + " h",
  celsius: (v, d) => roundNumber(v, d) + " °C",
  s: (v, d) => scaled(v * 1000, DURATION_MS, d),
  ms: (v, d) => scaled(v, DURATION_MS, d),
  currencyUSD: (v, d) => (v < 0 ? "-$" : "$") + Math.abs(v).toLocaleString("en-US", {
    minimumFractionDigits: d ?? 2, maximumFractionDigits: d ?? 2,
  }),
  short: (v, d) => scaled(v, SHORT, d),
};
const SHORT = [[1, ""], [1e3, " K"], [1e6, " Mil"], [1e9, " Bil"], [1e12, " Tri"]];

/** A value as Grafana writes it in `unit`; null as an en dash, an unknown unit as a suffix. */
function formatValue(value, unit, decimals) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (typeof value !== "number") return String(value);
  if (!unit || unit === "none") return Math.abs(value) >= 1e4 ? scaled(value, SHORT, decimals) : roundNumber(value, decimals);
  const format = UNITS[unit];
  if (format) return format(value, decimals);
  return roundNumber(value, decimals) + " " + unit;
}

/** Epoch ms of one of Grafana's time words: now, now-<n><unit> (now-6h) or epoch ms; NaN if neither. */
function instantOf(word, now = Date.now()) {
  if (word === "now") return now;
  const match = /^now-(\d+)([smhdwy])$/.exec(word || "");
  if (match) return now - Number(match[1]) * {s: 1, m: 60, h: 3600, d: 86400, w: 604800, y: 31536000}[match[2]] * 1000;
  return /^\d+$/.test(word || "") ? Number(word) : NaN;
}

/** Grafana's time words for the picker: "now-6h" -> "Last 6 hours". */
function rangeLabel(from, to) {
  const match = /^now-(\d+)([smhdwy])$/.exec(from || "");
  const words = {s: "second", m: "minute", h: "hour", d: "day", w: "week", y: "year"};
  if (match && to === "now") {
    const n = Number(match[1]);
    return `Last ${n} ${words[match[2]]}${n === 1 ? "" : "s"}`;
  }
  const show = (word) => (/^\d+$/.test(word) ? new Date(Number(word)).toISOString().slice(0, 16) : word);
  return `${show(from)} to ${show(to)}`;
}

/** A page-wide message (an API that did not answer): shown at the top, never only in the console. */
function showPageError(message) {
  const box = document.getElementById("page-error");
  if (!box) return;
  box.textContent = message;
  box.hidden = false;
}

function clearPageError() {
  const box = document.getElementById("page-error");
  if (box) box.hidden = true;
}
