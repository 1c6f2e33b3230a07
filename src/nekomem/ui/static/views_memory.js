// Views over the stored conversation and facts: Characters, Recent, Journal, Facts.
import { t } from "./i18n.js";
import { api, h, qs, fmtTime, localToIso, isoToLocal, pager, field, select, showError, status } from "./core.js";
import { deleteCharacterButton, forgetEntryButton, forgetRangeButton, forgetTurnButton } from "./views_erase.js";
import { moveButtons, originNote } from "./views_characters.js";

const enc = encodeURIComponent;
const PAGE = 50;

// -- Characters ----------------------------------------------------------------------------
// One page of the characters (offset/limit, sorted by name or last conversation, a name
// filter): the server counts a page from its per-root summary, so a big install lists fast.
export async function characters(box, ctx) {
  const picker = await ctx.reloadCharacters();
  if (!picker) return;
  const p = ctx.params;
  const offset = Number(p.get("offset") || 0);
  const query = { q: p.get("q") || "", sort: p.get("sort") || "name" };
  const data = await api("GET", "/api/browse/characters" + qs({ ...query, offset, limit: PAGE }));
  box.append(h("h2", {}, t("view_characters")));
  const keep = (extra) => ctx.go("characters", Object.fromEntries(Object.entries({ ...query, ...extra }).filter(([k, v]) => v && !(k === "sort" && v === "name"))));
  const text = h("input", { type: "search", value: query.q, "data-test": "characters-q" });
  text.addEventListener("keydown", (e) => { if (e.key === "Enter") keep({ q: text.value }); });
  const sort = select("sort", [["name", t("name")], ["last_conversation", t("last_conversation")]], query.sort);
  sort.setAttribute("data-test", "characters-sort");
  box.append(h("div", { class: "filters" }, field(t("text_filter"), text), field(t("order"), sort),
    h("button", { type: "button", "data-test": "characters-apply", onclick: () => keep({ q: text.value, sort: sort.value }) }, t("apply")),
    h("button", { type: "button", onclick: () => ctx.go("characters") }, t("clear"))));
  if (!data.total) { box.append(h("p", { class: "muted" }, t(query.q ? "nothing" : "no_characters"))); return; }
  box.append(pager(data.total, offset, PAGE, (o) => keep({ offset: o }), "characters-pager"));
  const head = ["name", "state", "turns", "recent", "facts", "facts_archived", "vectors_pending", "fact_backlog", "reflections", "persona", "corrections", "last_conversation", "storage"];
  const names = picker.characters.map((c) => c.name);
  const rows = data.characters.map((c) => {
    const r = c.counts.reflections || {};
    const refl = Object.entries(r).filter(([, n]) => n).map(([s, n]) => `${t("st_" + s)} ${n}`).join(", ") || "0";
    return h("tr", { "data-test": "character-row", "data-name": c.name },
      h("td", {}, h("a", { href: "#/facts", onclick: () => { const sel = document.getElementById("character"); sel.value = c.name; localStorage.setItem("nekomem.character", c.name); } }, c.name), originNote(c)),
      h("td", { class: c.active ? "ok" : "muted" }, c.active ? t("active") : t("passive")),
      h("td", { class: "num" }, c.turns), h("td", { class: "num" }, c.counts.recent),
      h("td", { class: "num", "data-test": "fact-count" }, c.counts.facts), h("td", { class: "num" }, c.counts.facts_archived),
      h("td", { class: c.embeddings_pending ? "num warn" : "num", "data-test": "vectors-pending" }, c.embeddings_pending || 0),
      h("td", { class: c.fact_backlog ? "num warn" : "num", "data-test": "fact-backlog" }, c.fact_backlog || 0),
      h("td", {}, refl), h("td", { class: "num" }, c.counts.persona), h("td", { class: "num" }, c.counts.corrections),
      h("td", {}, fmtTime(c.last_conversation_at)),
      h("td", { class: c.trouble.length ? "trouble warn" : "trouble ok" }, c.trouble.length ? c.trouble.join("; ") : t("no_trouble")),
      h("td", { class: "actions" }, ...moveButtons(ctx, c, names), deleteCharacterButton(ctx, c)));
  });
  // The table scrolls inside its own box: at a narrow width the page itself stays put and
  // every column is reached by scrolling the box (the name column stays in view).
  box.append(h("div", { class: "table-scroll", "data-test": "characters-scroll" },
    h("table", { class: "characters", "data-test": "characters" }, h("tr", {}, [...head.map((k) => h("th", {}, t(k))), h("th", {})]), rows)));
}

// -- Recent --------------------------------------------------------------------------------
export async function recent(box, ctx) {
  const base = `/api/characters/${enc(ctx.name)}/recent`;
  const [data, review] = await Promise.all([api("GET", base), api("GET", "/api/memory/review_config").catch(() => null)]);
  box.append(h("h2", {}, t("view_recent"), " — ", ctx.name));
  if (review) {
    const cb = h("input", { type: "checkbox", "data-test": "review-switch", checked: review.enabled, onchange: async (e) => {
      try { await api("POST", "/api/memory/review_config", { enabled: e.target.checked }); status(t("saved"), "ok"); } catch (err) { showError(err); }
    } });
    box.append(h("p", {}, h("label", {}, cb, " ", t("review_switch"))), h("p", { class: "muted" }, t("review_help")));
  }
  box.append(h("p", { class: "muted" }, t("recent_stored"), " ", data.stored_total));
  const rows = data.items.map((item) => {
    const textCell = h("td", { "data-test": "turn-text" }, item.text);
    const edit = () => {
      const area = h("textarea", { rows: 3, "data-test": "turn-edit" }, item.text);
      textCell.replaceChildren(area, h("button", { type: "button", "data-test": "turn-save", onclick: async () => {
        try { await api("PATCH", `${base}/${item.index}`, { text: area.value }); ctx.refresh(); } catch (e) { showError(e); }
      } }, t("save")));
    };
    const del = async () => {
      if (!confirm(t("confirm_delete"))) return;
      try { await api("DELETE", `${base}/${item.index}`); ctx.refresh(); } catch (e) { showError(e); }
    };
    const memo = item.role === "system";
    return h("tr", { class: memo ? "memo" : null, "data-test": "turn-row" },
      h("td", { class: "num" }, item.index), h("td", {}, memo ? t("memo") : t("role_" + item.role)), h("td", {}, fmtTime(item.ts)), textCell,
      h("td", {}, h("button", { type: "button", onclick: edit, "data-test": "turn-edit-button" }, t("edit")), " ",
        h("button", { type: "button", class: "danger", onclick: del, "data-test": "turn-delete" }, t("delete"))));
  });
  box.append(h("table", { "data-test": "recent" }, h("tr", {}, ["#", t("role"), t("time"), t("text"), ""].map((x) => h("th", {}, x))), rows));
  if (!data.items.length) box.append(h("p", { class: "muted" }, t("nothing")));
}

// -- Journal -------------------------------------------------------------------------------
export async function journal(box, ctx) {
  const p = ctx.params;
  const offset = Number(p.get("offset") || 0);
  const query = { since: p.get("since"), until: p.get("until"), q: p.get("q"), order: p.get("order") || "desc", offset, limit: PAGE };
  const data = await api("GET", `/api/browse/${enc(ctx.name)}/journal${qs(query)}`);
  const since = h("input", { type: "datetime-local", name: "since", step: 1, value: isoToLocal(query.since) });
  const until = h("input", { type: "datetime-local", name: "until", step: 1, value: isoToLocal(query.until) });
  const text = h("input", { type: "search", name: "q", value: query.q || "", "data-test": "journal-q" });
  const order = select("order", [["desc", t("newest_first")], ["asc", t("oldest_first")]], query.order);
  const apply = (extra) => ctx.go("journal", Object.fromEntries(Object.entries({
    since: localToIso(since.value), until: localToIso(until.value),
    q: text.value, order: order.value, ...extra }).filter(([, v]) => v !== "" && v !== null && v !== undefined)));
  box.append(h("h2", {}, t("view_journal"), " — ", ctx.name),
    h("div", { class: "filters" }, field(t("since"), since), field(t("until"), until), field(t("text_filter"), text), field(t("order"), order),
      h("button", { type: "button", "data-test": "journal-apply", onclick: () => apply({}) }, t("apply")),
      h("button", { type: "button", onclick: () => ctx.go("journal") }, t("clear"))));
  if (query.since || query.until) box.append(h("p", { class: "muted", "data-test": "journal-range" }, `${t("range")}: ${fmtTime(query.since)} → ${fmtTime(query.until)}`));
  const go = (o) => ctx.go("journal", Object.fromEntries(Object.entries({ ...query, limit: undefined, offset: o }).filter(([, v]) => v !== null && v !== undefined && v !== "")));
  if (query.since && query.until && !query.q) box.append(h("p", {}, forgetRangeButton(ctx, query.since, query.until, data.total)));
  box.append(pager(data.total, offset, PAGE, go, "journal-pager"));
  box.append(h("table", { "data-test": "journal" }, h("tr", {}, ["#", t("time"), t("role"), t("text"), ""].map((x) => h("th", {}, x))),
    data.items.map((row) => h("tr", { "data-test": "journal-row", "data-id": row.id }, h("td", { class: "num" }, row.id), h("td", {}, fmtTime(row.ts)),
      h("td", {}, t("role_" + row.role)), h("td", {}, row.text), h("td", {}, forgetTurnButton(ctx, row))))));
}

// -- Facts ---------------------------------------------------------------------------------
function factFilters(p) {
  return { entity: p.get("entity"), importance_min: p.get("importance_min"), importance_max: p.get("importance_max"), absorbed: p.get("absorbed"),
    event_from: p.get("event_from"), event_to: p.get("event_to"), q: p.get("q") };
}

function sourceJump(ctx, fact) {
  const ref = fact.source_ref;
  if (ref && ref.kind === "turns" && ref.from) {
    const pad = (iso, s) => new Date(new Date(iso).getTime() + s * 1000).toISOString();
    return () => ctx.go("journal", { since: pad(ref.from, -1), until: pad(ref.to || ref.from, 1), order: "asc" });
  }
  return () => ctx.go("journal", { until: fact.created_at, order: "desc" });
}

function factRow(ctx, fact, archived) {
  const base = `/api/characters/${enc(ctx.name)}/facts/${enc(fact.id)}`;
  const textCell = h("td", { "data-test": "fact-text" }, fact.text, archived ? h("span", { class: "tag archived" }, t("archived")) : null);
  const edit = () => {
    const area = h("textarea", { rows: 2, "data-test": "fact-edit-text" }, fact.text);
    const imp = h("input", { type: "number", min: 1, max: 10, value: fact.importance, "data-test": "fact-edit-importance" });
    const ent = select("entity", [["master", t("ent_master")], ["neko", t("ent_neko")], ["relationship", t("ent_relationship")]], fact.entity);
    textCell.replaceChildren(area, h("div", {}, imp, " ", ent, " ", h("button", { type: "button", "data-test": "fact-save", onclick: async () => {
      try { await api("PATCH", base, { text: area.value, importance: Number(imp.value), entity: ent.value }); status(t("saved"), "ok"); ctx.refresh(); } catch (e) { showError(e); }
    } }, t("save"))));
  };
  return h("tr", { "data-test": archived ? "archived-fact-row" : "fact-row", "data-id": fact.id }, textCell,
    h("td", {}, t("ent_" + fact.entity)), h("td", { class: "num" }, fact.importance),
    h("td", {}, fmtTime(fact.event_end_at || fact.event_start_at)), h("td", {}, fmtTime(fact.created_at)),
    h("td", {}, fact.absorbed ? t("yes") : t("no")),
    h("td", {}, archived ? null : h("button", { type: "button", onclick: edit, "data-test": "fact-edit" }, t("edit")), " ",
      forgetEntryButton(ctx, "fact", fact.id, fact.text), " ",
      h("button", { type: "button", onclick: sourceJump(ctx, fact), "data-test": "fact-source" }, t("source_turns"))));
}

function factTable(ctx, items, archived, testid) {
  const head = [t("text"), t("entity"), t("importance"), t("event_time"), t("created"), t("absorbed"), ""];
  return h("table", { "data-test": testid }, h("tr", {}, head.map((x) => h("th", {}, x))), items.map((f) => factRow(ctx, f, archived)));
}

export async function facts(box, ctx) {
  const started = performance.now();
  const p = ctx.params;
  const filters = factFilters(p);
  const offset = Number(p.get("offset") || 0);
  const aoffset = Number(p.get("aoffset") || 0);
  const path = `/api/browse/${enc(ctx.name)}/facts`;
  const [active, archived] = await Promise.all([
    api("GET", path + qs({ ...filters, status: "active", offset, limit: PAGE })),
    api("GET", path + qs({ ...filters, status: "archived", offset: aoffset, limit: 20 })),
  ]);
  const input = (name, type, extra) => h("input", { name, type, value: type === "datetime-local" ? isoToLocal(filters[name]) : filters[name] || "", ...extra });
  const f = {
    q: input("q", "search", { "data-test": "facts-q" }),
    entity: select("entity", [["", t("any")], ["master", t("ent_master")], ["neko", t("ent_neko")], ["relationship", t("ent_relationship")]], filters.entity || ""),
    importance_min: input("importance_min", "number", { min: 1, max: 10, "data-test": "facts-importance-min" }),
    importance_max: input("importance_max", "number", { min: 1, max: 10 }),
    absorbed: select("absorbed", [["", t("any")], ["true", t("yes")], ["false", t("no")]], filters.absorbed || ""),
    event_from: input("event_from", "datetime-local"),
    event_to: input("event_to", "datetime-local"),
  };
  const apply = () => {
    const v = {};
    for (const [k, el] of Object.entries(f)) {
      const val = el.type === "datetime-local" ? localToIso(el.value) : el.value;
      if (val) v[k] = val;
    }
    ctx.go("facts", v);
  };
  const keep = (extra) => ctx.go("facts", Object.fromEntries(Object.entries({ ...filters, offset, aoffset, ...extra }).filter(([, v]) => v)));
  box.append(h("h2", {}, t("view_facts"), " — ", ctx.name),
    h("div", { class: "filters" }, field(t("text_filter"), f.q), field(t("entity"), f.entity), field(t("importance_min"), f.importance_min),
      field(t("importance_max"), f.importance_max), field(t("absorbed"), f.absorbed), field(t("event_from"), f.event_from), field(t("event_to"), f.event_to),
      h("button", { type: "button", "data-test": "facts-apply", onclick: apply }, t("apply")),
      h("button", { type: "button", onclick: () => ctx.go("facts") }, t("clear"))),
    h("div", { class: "legs" },
      h("div", { class: "span2" }, h("h3", {}, t("active_facts"), ` (${active.total})`), pager(active.total, offset, PAGE, (o) => keep({ offset: o }), "facts-pager"),
        factTable(ctx, active.items, false, "facts"),
        active.total ? null : h("p", { class: "muted", "data-test": "empty-explained" }, t(filters.q || filters.entity ? "empty_filtered" : "empty_facts"))),
      h("div", {}, h("h3", {}, t("archived_facts"), ` (${archived.total})`), pager(archived.total, aoffset, 20, (o) => keep({ aoffset: o }), "archived-pager"),
        factTable(ctx, archived.items, true, "archived-facts"))));
  const ms = performance.now() - started;
  box.setAttribute("data-render-ms", ms.toFixed(1));
  box.append(h("p", { class: "muted", "data-test": "facts-timing" }, `${t("rendered_in")} ${ms.toFixed(0)} ms`));
}
