// The memory browser: hash routes (#/facts, #/journal?since=...) over one page.
import { t, setLang, currentLang, applyStatic } from "./i18n.js";
import { api, h, status, showError, getToken, setToken } from "./core.js";
import * as memory from "./views_memory.js";
import * as longterm from "./views_longterm.js";
import * as tools from "./views_tools.js";
import * as knowledge from "./views_knowledge.js";

const VIEWS = {
  characters: memory.characters,
  recent: memory.recent,
  journal: memory.journal,
  facts: memory.facts,
  reflections: longterm.reflections,
  persona: longterm.persona,
  recall: tools.recall,
  context: tools.context,
  knowledge: knowledge.knowledge,
  server: tools.server,
};
const NEEDS_CHARACTER = new Set(["recent", "journal", "facts", "reflections", "persona", "recall", "context"]);
const CHAR_KEY = "nekomem.character";

function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [name, query] = raw.split("?");
  return { view: VIEWS[name] ? name : "characters", params: new URLSearchParams(query || "") };
}

export function go(view, params) {
  const q = params ? new URLSearchParams(params).toString() : "";
  location.hash = "#/" + view + (q ? "?" + q : "");
}

function character() { return document.getElementById("character").value; }

// The last character list's failure (the server down, a token missing or wrong): shown
// again by every render until a list loads, since a render clears the status line.
let charactersError = null;

async function loadCharacters() {
  const sel = document.getElementById("character");
  try {
    // The picker: names only (brief rows from the summary), the first page by name; a
    // kept name beyond it is added, so a deep link still finds its character.
    const data = await api("GET", "/api/browse/characters?brief=true&limit=1000");
    const keep = sel.value || localStorage.getItem(CHAR_KEY) || "";
    const names = data.characters.map((c) => c.name);
    if (keep && !names.includes(keep) && data.total > names.length) names.push(keep);
    sel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    if (names.includes(keep)) sel.value = keep;
    charactersError = null;
    return data;
  } catch (e) { charactersError = e; showError(e); return null; }
}

function drawNav(active) {
  const nav = document.getElementById("nav");
  nav.replaceChildren(...Object.keys(VIEWS).map((v) =>
    h("a", { href: "#/" + v, class: v === active ? "active" : null, "data-view": v }, t("view_" + v))));
}

// The banner over every view: no model configured (facts and reflections will not
// appear) or a model tier failing; refreshed with each view.
async function drawBanner() {
  const el = document.getElementById("banner");
  let health;
  try { health = await api("GET", "/health"); } catch (e) { el.hidden = true; return; }
  const llm = health.llm || {};
  let text = "", kind = "";
  if (llm.state === "unconfigured") { text = t("no_model_banner"); kind = "no-model"; }
  else if (llm.state === "failing") { text = t("model_failing_banner").replace("{tiers}", (llm.failing_tiers || []).join(", ")); kind = "model-failing"; }
  el.hidden = !text;
  el.textContent = text;
  el.setAttribute("data-kind", kind);
}

let renderSeq = 0;
async function render() {
  const { view, params } = route();
  const seq = ++renderSeq;
  drawNav(view);
  applyStatic();
  status("");
  const main = document.getElementById("view");
  main.setAttribute("data-view", view);
  main.setAttribute("data-ready", "false");
  main.setAttribute("data-seq", String(seq));
  await charactersLoaded;
  await drawBanner();
  if (charactersError) showError(charactersError);
  const name = character();
  if (NEEDS_CHARACTER.has(view) && !name) {
    main.replaceChildren(h("p", { class: "muted" }, t("no_character")));
    main.setAttribute("data-ready", "true");
    return;
  }
  const box = h("div", {});
  main.replaceChildren(box);
  try {
    await VIEWS[view](box, { name, params, go, refresh: render, reloadCharacters: loadCharacters });
  } catch (e) { showError(e); }
  if (seq === renderSeq) main.setAttribute("data-ready", "true");
}

function setupChrome() {
  const lang = document.getElementById("lang");
  lang.value = currentLang();
  lang.addEventListener("change", () => { setLang(lang.value); render(); });
  document.getElementById("character").addEventListener("change", (e) => {
    localStorage.setItem(CHAR_KEY, e.target.value);
    render();
  });
  const box = document.getElementById("token-box");
  const input = document.getElementById("token-input");
  document.getElementById("token-button").addEventListener("click", () => { box.hidden = !box.hidden; input.value = getToken(); });
  document.getElementById("token-save").addEventListener("click", async () => {
    setToken(input.value.trim());
    box.hidden = true;
    await loadCharacters();
    render();
  });
  document.addEventListener("nekomem-auth", (e) => { box.hidden = false; status(t(e.detail && e.detail.wrong ? "wrong_token" : "need_token")); });
  window.addEventListener("hashchange", render);
}

setupChrome();
setLang(currentLang());
// Every render waits for the first character list, so a deep link (#/facts) never renders
// before the character it needs is known.
const charactersLoaded = loadCharacters();
render();
