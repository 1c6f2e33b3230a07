// Views over long-term memory: Reflections (with the evidence chart) and Persona.
import { t } from "./i18n.js";
import { api, h, qs, fmtTime, fmtNum, showError, status, entityLabel, field, select } from "./core.js";
import { evidenceChart } from "./chart.js";
import { forgetEntryButton } from "./views_erase.js";

const enc = encodeURIComponent;
const COLUMNS = ["pending", "confirmed", "promoted", "denied", "archived"];

async function feedback(ctx, id, value) {
  try {
    const r = await api("POST", `/api/characters/${enc(ctx.name)}/reflections/${enc(id)}/feedback`, { feedback: value });
    status(`${t("feedback_sent")}: ${t("st_" + r.status)}`, "ok");
    ctx.go("reflections", { sel: id });
    if (ctx.params.get("sel") === id) ctx.refresh();
  } catch (e) { showError(e); }
}

function card(ctx, r, selected) {
  const live = r.status === "pending" || r.status === "confirmed";
  return h("div", { class: "card", "data-test": "reflection-card", "data-id": r.id, "data-status": r.status },
    h("div", {}, r.text),
    h("div", { class: "meta" }, t("ent_" + r.entity) || r.entity, " · ", t("score"), " ", fmtNum(r.evidence_score, 2), " · ", fmtTime(r.created_at)),
    h("div", { class: "actions" },
      live ? h("button", { type: "button", "data-test": "confirm", onclick: () => feedback(ctx, r.id, "confirmed") }, t("confirm")) : null,
      live ? h("button", { type: "button", class: "danger", "data-test": "deny", onclick: () => feedback(ctx, r.id, "denied") }, t("deny")) : null,
      r.status === "archived" ? null : h("button", { type: "button", "data-test": "show-evidence", disabled: selected, onclick: () => ctx.go("reflections", { sel: r.id }) }, t("evidence")),
      r.status === "archived" ? null : forgetEntryButton(ctx, "reflection", r.id, r.text)));
}

async function detail(ctx, id) {
  const box = h("div", { class: "card", "data-test": "reflection-detail" });
  const hist = await api("GET", `/api/browse/${enc(ctx.name)}/reflections/${enc(id)}/evidence`);
  const r = hist.reflection;
  box.append(h("h3", {}, r.text), h("p", { class: "meta" }, `${t("status")}: `, h("b", { "data-test": "detail-status" }, t("st_" + r.status)),
    ` · ${t("net_score")} ${fmtNum(hist.net_now, 3)} · ${t("history_since")} ${fmtTime(hist.history_since)}`));
  box.append(evidenceChart(hist));
  box.append(h("h3", {}, t("events")), h("table", { "data-test": "evidence-events" },
    h("tr", {}, [t("time"), t("event"), t("status"), t("reinforcement"), t("disputation")].map((x) => h("th", {}, x))),
    hist.events.map((e) => h("tr", {}, h("td", {}, fmtTime(e.t)), h("td", {}, e.type), h("td", {}, t("st_" + e.status)),
      h("td", { class: "num" }, fmtNum(e.reinforcement, 2)), h("td", { class: "num" }, fmtNum(e.disputation, 2))))));
  const ids = (r.source_fact_ids || []).join(",");
  box.append(h("h3", {}, t("source_facts")));
  if (ids) {
    const facts = await api("GET", `/api/browse/${enc(ctx.name)}/facts${qs({ status: "all", ids, limit: 100 })}`);
    box.append(h("ul", { "data-test": "source-facts" }, facts.items.map((f) => h("li", {}, f.text, f.archived ? h("span", { class: "tag archived" }, t("archived")) : null))));
  } else box.append(h("p", { class: "muted" }, t("nothing")));
  return box;
}

export async function reflections(box, ctx) {
  const base = `/api/characters/${enc(ctx.name)}/reflections`;
  const lists = await Promise.all(COLUMNS.map((st) => st === "archived"
    ? api("GET", `/api/browse/${enc(ctx.name)}/reflections_archived${qs({ limit: 100 })}`)
    : api("GET", base + qs({ status: st, limit: 100 }))));
  const sel = ctx.params.get("sel");
  box.append(h("h2", {}, t("view_reflections"), " — ", ctx.name));
  box.append(h("div", { class: "columns" }, COLUMNS.map((st, i) => h("div", { class: "column", "data-test": "column-" + st },
    h("h3", {}, t("st_" + st), ` (${lists[i].total})`), lists[i].items.map((r) => card(ctx, r, r.id === sel)),
    lists[i].total ? null : h("p", { class: "muted", "data-test": "empty-explained" }, t("empty_" + st))))));
  if (sel) {
    try { box.append(await detail(ctx, sel)); } catch (e) { showError(e); }
  }
}

// -- Persona -------------------------------------------------------------------------------
async function setSuppressed(ctx, id, value) {
  try { await api("POST", `/api/browse/${enc(ctx.name)}/persona/${enc(id)}/suppress`, { suppress: value }); status(t("saved"), "ok"); ctx.refresh(); }
  catch (e) { showError(e); }
}

async function savePersona(ctx, id, text) {
  try { await api("PATCH", `/api/characters/${enc(ctx.name)}/persona/${enc(id)}`, { text }); status(t("saved"), "ok"); ctx.refresh(); }
  catch (e) { showError(e); }
}

// A new entry the user writes is a protected card entry (kept as written, never demoted).
function addForm(ctx) {
  const text = h("input", { type: "text", size: 60, "data-test": "persona-new-text" });
  const entity = select("entity", [["neko", t("ent_neko")], ["master", t("ent_master")], ["relationship", t("ent_relationship")]], "neko");
  entity.setAttribute("data-test", "persona-new-entity");
  const add = async () => {
    if (!text.value.trim()) { status(t("persona_empty")); return; }
    try {
      await api("POST", `/api/characters/${enc(ctx.name)}/card`, { entries: [{ entity: entity.value, text: text.value.trim() }] });
      status(t("saved"), "ok"); ctx.refresh();
    } catch (e) { showError(e); }
  };
  return h("div", { class: "filters", "data-test": "persona-add" }, field(t("entity"), entity), field(t("text"), text),
    h("button", { type: "button", "data-test": "persona-add-button", onclick: add }, t("persona_add")));
}

function textCell(ctx, e) {
  const cell = h("td", { "data-test": "persona-text" }, e.text);
  const edit = () => {
    const input = h("input", { type: "text", size: 60, value: e.text, "data-test": "persona-edit-input" });
    cell.replaceChildren(input, " ", h("button", { type: "button", "data-test": "persona-edit-save", onclick: () => savePersona(ctx, e.id, input.value) }, t("save")));
    input.focus();
  };
  return [cell, edit];
}

export async function persona(box, ctx) {
  const [entries, corrections] = await Promise.all([
    api("GET", `/api/characters/${enc(ctx.name)}/persona${qs({ limit: 1000 })}`),
    api("GET", `/api/browse/${enc(ctx.name)}/corrections`),
  ]);
  box.append(h("h2", {}, t("view_persona"), " — ", ctx.name), addForm(ctx));
  const byEntity = {};
  for (const e of entries.items) (byEntity[e.entity] ||= []).push(e);
  if (!entries.items.length) box.append(h("p", { class: "muted", "data-test": "empty-explained" }, t("empty_persona")));
  for (const [entity, list] of Object.entries(byEntity)) {
    box.append(h("h3", { "data-test": "persona-heading" }, entityLabel(entity), ` (${list.length})`), h("table", { "data-test": "persona-" + entity },
      h("tr", {}, [t("text"), t("marks"), t("score"), t("source"), ""].map((x) => h("th", {}, x))),
      list.map((e) => { const [cell, edit] = textCell(ctx, e); return h("tr", { "data-test": "persona-row", "data-id": e.id },
        cell,
        h("td", {}, e.protected ? h("span", { class: "tag protected", "data-test": "protected" }, t("protected")) : null,
          e.suppress ? h("span", { class: "tag suppressed", "data-test": "suppressed" }, t("suppressed")) : null),
        h("td", { class: "num" }, e.evidence_score === null ? "∞" : fmtNum(e.evidence_score, 2)),
        h("td", {}, e.source),
        h("td", {}, h("button", { type: "button", "data-test": "persona-edit", onclick: edit }, t("edit")), " ", e.protected ? null : e.suppress
          ? h("button", { type: "button", "data-test": "unsuppress", onclick: () => setSuppressed(ctx, e.id, false) }, t("unsuppress"))
          : h("button", { type: "button", "data-test": "suppress", onclick: () => setSuppressed(ctx, e.id, true) }, t("suppress")),
          " ", forgetEntryButton(ctx, "persona", e.id, e.text))); })));
  }
  box.append(h("h3", {}, t("corrections"), ` (${corrections.total})`), h("p", { class: "muted" }, t("corrections_help")));
  box.append(h("table", { "data-test": "corrections" },
    h("tr", {}, [t("entity"), t("old_text"), t("new_text"), t("queued"), t("attempts")].map((x) => h("th", {}, x))),
    corrections.items.map((c) => h("tr", {}, h("td", {}, entityLabel(c.entity)), h("td", {}, c.old_text), h("td", {}, c.new_text),
      h("td", {}, fmtTime(c.created_at)), h("td", { class: "num" }, c.resolve_attempts)))));
}
