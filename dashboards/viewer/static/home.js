/* FleetSight viewer, home page: the dashboards grouped by the reader they are for. */
"use strict";

const PERSONA_ORDER = ["researcher", "sysadmin", "facilities", "executive"];

function personaSection(persona, dashboards) {
  const items = dashboards.map((d) => el("li", {"data-uid": d.uid},
    el("a", {href: d.url}, d.title), el("p", {}, d.question || "")));
  return el("section", {class: "persona", "data-persona": persona}, el("h2", {}, persona), el("ul", {}, items));
}

function byPersona(dashboards) {
  const groups = new Map(PERSONA_ORDER.map((p) => [p, []]));
  for (const d of dashboards) {
    const persona = d.persona || "other";
    if (!groups.has(persona)) groups.set(persona, []);
    groups.get(persona).push(d);
  }
  return [...groups].filter(([, list]) => list.length);
}

async function drawHome() {
  const main = document.getElementById("personas");
  try {
    const answer = await api("/api/dashboards");
    main.replaceChildren(...byPersona(answer.dashboards).map(([p, list]) => personaSection(p, list)));
    if (answer.chat) {
      document.getElementById("links").append(el("a", {href: answer.chat, id: "chat-link"}, "Ask the chatbot"));
    }
  } catch (error) {
    showPageError(`The dashboard list did not load: ${error.message}`);
  } finally {
    main.removeAttribute("aria-busy");
  }
}

drawHome();
