// Public knowledge (/internal/knowledge/*): the packs, their import jobs, the entries and a
// query playground that shows exactly what the chat server's tool would receive.
import { t } from "./i18n.js";
import { api, h, qs, fmtTime, field, select, showError, status, pager } from "./core.js";

const K = "/internal/knowledge";
const PAGE = 20;

function kv(pairs, testid) {
  return h("div", { class: "kv", "data-test": testid }, pairs.flatMap(([k, v]) => [h("span", { class: "muted" }, k), h("span", {}, String(v))]));
}

// Run a management write, then redraw; a refusal ({ok: false, reason}) is shown as such.
async function write(ctx, path, body) {
  try {
    const r = await api("POST", K + path, body);
    if (r.ok === false) { status(`${t("refused")}: ${r.reason || ""}`); return r; }
    status(t("saved"), "ok");
    await ctx.refresh();
    return r;
  } catch (e) { showError(e); return null; }
}

function importBox(ctx) {
  const file = h("input", { type: "file", accept: ".json,application/json", "data-test": "pack-file" });
  const run = async () => {
    const chosen = file.files && file.files[0];
    if (!chosen) { status(t("choose_pack")); return; }
    let body;
    try { body = JSON.parse(await chosen.text()); } catch (e) { status(`${t("refused")}: invalid_json`); return; }
    const r = await write(ctx, "/packs/import", body);
    if (r && r.unchanged) status(t("pack_unchanged"), "ok");
  };
  return h("div", { class: "filters" }, field(t("import_pack"), file), h("button", { type: "button", "data-test": "pack-import", onclick: run }, t("import")));
}

function packTable(ctx, packs) {
  const toggle = (pack, key, path, field_) => h("input", { type: "checkbox", "data-test": key, checked: pack[key],
    onchange: (e) => write(ctx, path, { pack_id: pack.pack_id, [field_]: e.target.checked }) });
  const remove = (pack) => {
    const b = h("button", { type: "button", "data-test": "pack-remove" }, t("remove"));
    b.addEventListener("click", () => {
      if (b.getAttribute("data-armed")) { write(ctx, "/packs/remove", { pack_id: pack.pack_id }); return; }
      b.setAttribute("data-armed", "1");
      b.textContent = t("confirm_remove");
    });
    return b;
  };
  return h("table", { "data-test": "packs" },
    h("tr", {}, [t("pack"), t("source"), t("material"), t("entries"), t("vectors"), t("auto_context"), t("local_vectors"), ""].map((x) => h("th", {}, x))),
    packs.map((p) => h("tr", { "data-test": "pack-row", "data-pack": p.pack_id, class: p.broken ? "removed" : null },
      h("td", {}, p.pack_id), h("td", {}, p.source.name, p.source.license ? ` (${p.source.license})` : ""),
      h("td", {}, t("mt_" + p.effective_material_type) || p.effective_material_type),
      h("td", { class: "num" }, p.disabled_entries ? `${p.entries} (−${p.disabled_entries})` : p.entries),
      h("td", {}, `${t("vs_" + p.vector_state) || p.vector_state} ${p.chunks_ready}/${p.chunks_total}`),
      h("td", {}, toggle(p, "auto_context", "/packs/auto-context", "enabled")),
      h("td", {}, toggle(p, "local_embedding", "/packs/index-policy", "local_embedding_enabled")),
      h("td", {}, remove(p)))));
}

function jobTable(ctx, jobs) {
  const action = (job) => ["queued", "building"].includes(job.state)
    ? h("button", { type: "button", "data-test": "job-cancel", onclick: () => write(ctx, "/packs/jobs/cancel", { job_id: job.job_id }) }, t("cancel"))
    : h("button", { type: "button", "data-test": "job-discard", onclick: () => write(ctx, "/packs/jobs/discard", { job_id: job.job_id }) }, t("discard"));
  return h("table", { "data-test": "jobs" },
    h("tr", {}, [t("pack"), t("job_state"), t("progress"), t("reason"), t("updated"), ""].map((x) => h("th", {}, x))),
    jobs.map((j) => h("tr", { "data-test": "job-row", "data-state": j.state, "data-pack": j.pack_id },
      h("td", {}, j.pack_id), h("td", { class: j.state === "failed" ? "warn" : null }, t("js_" + j.state) || j.state),
      h("td", { class: "num" }, `${j.entries_indexed}/${j.entries_total}`), h("td", {}, j.reason || "—"), h("td", {}, fmtTime(j.updated_at)), h("td", {}, action(j)))));
}

async function entriesBox(box, ctx, packs) {
  const p = ctx.params;
  const offset = Number(p.get("offset") || 0);
  const q = h("input", { type: "search", name: "entries", value: p.get("entries") || "", size: 30, "data-test": "entries-query" });
  const pack = select("pack", [["", t("all_packs")], ...packs.map((x) => [x.pack_id, x.pack_id])], p.get("pack") || "");
  const go = (extra) => ctx.go("knowledge", Object.fromEntries(Object.entries({ ...Object.fromEntries(p), entries: q.value, pack: pack.value, offset: 0, ...extra }).filter(([, v]) => v !== "" && v !== 0 && v !== "0")));
  q.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
  box.append(h("h3", {}, t("entries")), h("div", { class: "filters" }, field(t("query"), q), field(t("pack"), pack), h("button", { type: "button", "data-test": "entries-run", onclick: () => go() }, t("search"))));
  const r = await api("GET", K + "/entries" + qs({ query: p.get("entries") || "", pack_id: p.get("pack") || "", limit: PAGE, offset }));
  box.append(h("table", { "data-test": "entries" },
    h("tr", {}, [t("title"), t("pack"), t("summary"), t("disabled")].map((x) => h("th", {}, x))),
    r.items.map((e) => h("tr", { "data-test": "entry-row", "data-title": e.title, class: e.disabled ? "removed" : null },
      h("td", {}, e.title), h("td", {}, e.pack_id), h("td", {}, e.summary || e.content_preview),
      h("td", {}, h("input", { type: "checkbox", "data-test": "entry-disabled", checked: e.disabled,
        onchange: (ev) => write(ctx, "/entry/disabled", { pack_id: e.pack_id, title: e.title, disabled: ev.target.checked }) }))))));
  if (r.total !== null) box.append(pager(r.total, offset, PAGE, (o) => go({ offset: o }), "entries-pager"));
  else if (r.has_more || offset) {
    box.append(h("div", { class: "pager" },
      h("button", { type: "button", disabled: offset <= 0, onclick: () => go({ offset: Math.max(0, offset - PAGE) }) }, t("previous")),
      h("button", { type: "button", disabled: !r.has_more, onclick: () => go({ offset: offset + PAGE }) }, t("next"))));
  }
}

async function playground(box, ctx) {
  const p = ctx.params;
  const q = h("input", { type: "search", name: "ask", value: p.get("ask") || "", size: 40, "data-test": "knowledge-query" });
  const lang = select("lang", [["zh", "中文"], ["ja", "日本語"], ["en", "English"]], p.get("lang") || "zh");
  const mode = select("mode", [["lookup", "lookup"], ["sample", "sample"]], p.get("mode") || "lookup");
  const run = () => ctx.go("knowledge", Object.fromEntries(Object.entries({ ...Object.fromEntries(p), ask: q.value, lang: lang.value, mode: mode.value }).filter(([, v]) => v)));
  q.addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
  box.append(h("h3", {}, t("knowledge_playground")), h("p", { class: "muted" }, t("knowledge_playground_help")),
    h("div", { class: "filters" }, field(t("query"), q), field(t("language"), lang), field(t("mode"), mode), h("button", { type: "button", "data-test": "knowledge-run", onclick: run }, t("search"))));
  if (!p.get("ask")) return;
  const r = await api("POST", K + "/query", { query: p.get("ask"), language: p.get("lang") || "zh", mode: p.get("mode") || "lookup", limit: 3 });
  box.append(kv([[t("result"), r.result], [t("retrieval"), r.retrieval_mode || "—"], [t("elapsed"), `${r.elapsed_ms} ms`],
    [t("hits"), r.hits.map((x) => `${x.title} (${x.pack_id})`).join(", ") || "—"]], "knowledge-result"));
  if (r.context) box.append(h("pre", { class: "context", "data-test": "knowledge-context" }, r.context));
}

export async function knowledge(box, ctx) {
  const [st, packs, jobs] = await Promise.all([api("GET", K + "/status"), api("GET", K + "/packs").catch(() => ({ packs: [] })), api("GET", K + "/packs/jobs").catch(() => ({ jobs: [] }))]);
  const s = st.status;
  box.append(h("h2", {}, t("view_knowledge")), h("p", { class: "muted" }, t("knowledge_help")));
  const on = h("input", { type: "checkbox", "data-test": "knowledge-switch", checked: st.enabled, onchange: (e) => write(ctx, "/settings", { enabled: e.target.checked }) });
  box.append(h("p", {}, h("label", {}, on, " ", t("knowledge_switch"))));
  box.append(kv([
    [t("state"), s.state], [t("tool_available"), st.tool_available ? t("yes") : t("no")],
    [t("packs"), s.packs ?? 0], [t("entries"), `${s.entries ?? 0} (${t("disabled")}: ${s.disabled_entries ?? 0})`],
    [t("vectors"), `${s.chunks_ready ?? 0}/${s.chunks_total ?? 0} (${s.indexed_percent ?? 0}%) — ${s.embedding.state}`],
  ], "knowledge-status"));
  box.append(h("h3", {}, t("packs")), importBox(ctx), packTable(ctx, packs.packs));
  box.append(h("h3", {}, t("jobs")), jobTable(ctx, jobs.jobs));
  await entriesBox(box, ctx, packs.packs);
  await playground(box, ctx);
}
