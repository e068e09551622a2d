// The chat page: POST the question to /v1/ask, show the answer, its live evidence and citation links.
"use strict";

const form = document.getElementById("ask-form");
const input = document.getElementById("question");
const button = document.getElementById("ask");
const answers = document.getElementById("answers");
// Where asking needs a token (--token-asks), the person pastes theirs once; it stays in this tab only.
const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("fleetsight-token") || "";
tokenInput.hidden = !tokenInput.value;
tokenInput.addEventListener("change", () => sessionStorage.setItem("fleetsight-token", tokenInput.value.trim()));

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// Bold (**x**), code spans and fences, on escaped text.
function formatText(text) {
  return escapeHtml(text)
    .replace(/```[^\n]*\n([\s\S]*?)```/g, (_, code) => `<code>${code}</code>`)
    .replace(/\*\*(.+?)\*\*/g, "<strong>$1</strong>")
    .replace(/`([^`\n]+)`/g, "<code>$1</code>");
}

function element(tag, className, html) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (html !== undefined) node.innerHTML = html;
  return node;
}

function render(question, body) {
  const box = element("div", "exchange" + (body.declined ? " declined" : ""));
  box.appendChild(element("div", "question", escapeHtml(question)));
  const liveLines = body.answer.split("\n\n")[0].startsWith("Live (") || body.answer.startsWith("Note:")
    ? body.answer.split("\n\n")[0] : null;
  if (liveLines) box.appendChild(element("div", "live", formatText(liveLines)));
  const rest = liveLines ? body.answer.split("\n\n").slice(1).join("\n\n") : body.answer;
  box.appendChild(element("div", "answer", formatText(rest)));
  const list = element("ul", "citations");
  for (const c of body.citations) {
    const item = element("li");
    const link = element("a", "citation", `[${c.n}] ${escapeHtml(c.file)} — ${escapeHtml(c.section)}`);
    link.href = `/files/${c.file}#${c.anchor}`;
    link.target = "_blank";
    item.appendChild(link);
    list.appendChild(item);
  }
  for (const file of body.closest || []) {
    const item = element("li");
    const link = element("a", "closest", `closest: ${escapeHtml(file)}`);
    link.href = `/files/${file}`;
    item.appendChild(link);
    list.appendChild(item);
  }
  box.appendChild(list);
  box.appendChild(element("div", "meta", `${escapeHtml(body.mode)} · ${body.took_ms} ms`));
  answers.prepend(box);
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const question = input.value.trim();
  if (!question) return;
  button.disabled = true;
  try {
    const response = await fetch("/v1/ask", {
      method: "POST",
      headers: Object.assign(
        { "Content-Type": "application/json" },
        tokenInput.value.trim() ? { Authorization: `Bearer ${tokenInput.value.trim()}` } : {},
      ),
      body: JSON.stringify({ question }),
    });
    const body = await response.json();
    if (response.status === 401 || response.status === 403) tokenInput.hidden = false;
    if (!response.ok) {
      const box = element("div", "exchange");
      box.appendChild(element("div", "question", escapeHtml(question)));
      box.appendChild(element("div", "error", escapeHtml(String(body.detail || response.status))));
      answers.prepend(box);
    } else {
      render(question, body);
      input.value = "";
    }
  } catch (error) {
    answers.prepend(element("div", "exchange error", escapeHtml("the chatbot did not answer: " + error)));
  } finally {
    button.disabled = false;
    input.focus();
  }
});
